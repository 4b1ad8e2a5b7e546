"""What dcnb says when its C++ call path does not build."""

from dcnb._src import native

OUTPUT = """Error building extension 'dcnb_native_4b828c1f6b4328bd':
[1/2] c++ -MMD -MF native.o.d -DTORCH_EXTENSION_NAME=dcnb_native -c native.cpp -o native.o
FAILED: native.o
native.cpp:1:10: fatal error: Python.h: No such file or directory
compilation terminated.
ninja: build stopped: subcommand failed."""


def test_a_failed_build_is_told_by_the_compilers_first_error():
    # an H100 run said only "ninja: build stopped: subcommand failed", the last line
    assert native._cause(OUTPUT) == "native.cpp:1:10: fatal error: Python.h: No such file or directory"


def test_without_a_compiler_error_the_last_line_says_it():
    assert native._cause("ImportError: x.so: cannot open shared object file\n") == (
        "ImportError: x.so: cannot open shared object file"
    )
