"""Import DaCe without the script it shows in notebooks, nor its progress prints.

Imported inside a Jupyter kernel, ``dace`` displays its SDFG viewer's script as an output of the importing cell:
the whole viewer (7 MB) inlined into the notebook when the machine is offline. dcnb draws SDFGs itself (views/render.py
and the JupyterLab extension), so the import runs with displays captured and saved notebooks stay small.
"""

from __future__ import annotations

try:
    from IPython.utils.capture import capture_output
except ImportError:  # no IPython: nothing is displayed anyway
    import dace
else:
    with capture_output(stdout=False, stderr=False, display=True):
        import dace

# a DaCe pattern pass running over 5 s prints what it applied ("Applied 88 MapFusionVertical.\r") to stdout: into
# the cell's output and the benchmarks' JSON lines; the session reports its phases itself
dace.Config.set("progress", value=False)

# gap: DaCe keeps a transformation history by default: the first transformation of an SDFG (an ONNX node expanded on
# import) deep-copies the whole SDFG into its orig_sdfg, which every later copy (each step's, autodiff's) copies again
# and every serialization (each build's hash) writes out and drops; dcnb never reads it, and the hash leaves it out
dace.Config.set("store_history", value=False)

# gap: DaCe's RedundantArray prints a debugging line ("CREATED VIEW(2): <array>") to stdout whenever it makes a view,
# its module's only print: into the cell's output on every step of a weight-standardized convolution's model (BiT);
# a name of that module's own shadows the builtin there and nowhere else
from dace.transformation.dataflow import redundant_array  # noqa: E402

redundant_array.print = lambda *args, **kwargs: None

# every node added to any SDFG records its caller's line without walking the whole Python stack (the same line)
from dcnb._src import dace_internals  # noqa: E402

dace_internals.replace_debug_info()
# and a state is checked for cycles in one walk, not one per source node (the same answer)
dace_internals.replace_has_cycles()
# and code generation finds a state's sink nodes and a node's index without walking the state each time
dace_internals.replace_state_queries()
# and a state's scope children are worked out from its scope dictionary, not by a walk of their own
dace_internals.replace_scope_children()
# and a nested SDFG is added without a walk of its parent's arrays where nothing it maps lacks a type
dace_internals.replace_nested_sdfg_symbols()
# and the symbols of an SDFG's arrays are worked out again only for the arrays whose shape changed
dace_internals.replace_sdfg_symbols()
# and an SDFG's free symbols take the names of the arrays it reads or writes without working out what it reads where
dace_internals.replace_used_arrays()
# and a region added to a tree's region list is looked up in a set, not by a scan of the list
dace_internals.replace_cfg_list_update()
# and a state's scopes are kept across a library node's expansion into a nested SDFG, which moves no other node
dace_internals.replace_expansion_scopes()
# and, within expansions_reused(), a library node like one expanded before expands to a copy of what that one did
dace_internals.replace_expansion_reuse()
# and a library node expanded in a state that ends without a host wait expands into states that end without one
dace_internals.replace_nested_sdfg_syncs()
# and, with one stream asked for, every kernel and copy of a CUDA build goes to stream 0
dace_internals.replace_stream_numbers()
