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


def test_each_checkout_builds_in_a_folder_of_its_own(tmp_path, monkeypatch):
    # two checkouts sharing one folder rebuilt the extension each time the other had built it last
    first = native._folder()
    assert native._folder() == first
    copy = tmp_path / "checkout" / native._SOURCE.name
    copy.parent.mkdir()
    copy.write_bytes(native._SOURCE.read_bytes())
    monkeypatch.setattr(native, "_SOURCE", copy)
    assert native._folder() != first and native._folder().parent == first.parent
