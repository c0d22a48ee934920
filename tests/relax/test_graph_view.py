"""The Relax view: how bindings become nodes (value numbers, tensor operands, attributes)."""

from helpers import R, make_module
from tvm import relax, tirx

from tvm_combiners.relax.graph_view import build_block_view

F32 = "float32"


def _view(mod):
    """The block's view and its bound nodes by var name."""
    view = build_block_view(mod["main"].body.blocks[0])
    return view, {binding.var.name: node for node, binding in enumerate(view.bindings) if binding is not None}


def test_a_call_gets_one_value_number_whether_or_not_its_vars_were_read_before():
    """The first ``add`` is the first use of ``x`` and ``y`` (read through ``free_vars``), the
    second is read from its arguments: both must be numbered as one value, ``add(y, x)`` apart."""

    def body(bb, x, y):
        first = bb.emit(R.add(x, y), "first")
        second = bb.emit(R.add(x, y), "second")
        swapped = bb.emit(R.add(y, x), "swapped")
        return [first, second, swapped]

    mod = make_module({"x": ((2, 8), F32), "y": ((2, 8), F32)}, body)
    view, nodes = _view(mod)
    numbers = view.graph.value_numbers()
    assert numbers[nodes["first"]] == numbers[nodes["second"]] != numbers[nodes["swapped"]]
    assert view.arg_positions[nodes["first"]] == (0, 1)
    assert [view.graph[d].op for d in view.graph[nodes["first"]].operands] == ["Var", "Var"]


def test_a_shape_argument_is_an_attribute_and_its_symbolic_dims_are_dependencies():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(R.reshape(x, relax.ShapeExpr([n, 2, 4])), "a")
            b = bb.emit(R.reshape(x, relax.ShapeExpr([n, 2, 4])), "b")
            c = bb.emit(R.reshape(x, relax.ShapeExpr([n, 4, 2])), "c")
            out = bb.emit_output(relax.Tuple([a, b, c]))
        bb.emit_func_output(out)
    view, nodes = _view(bb.get())
    numbers = view.graph.value_numbers()
    assert numbers[nodes["a"]] == numbers[nodes["b"]] != numbers[nodes["c"]]
    node = nodes["a"]
    assert view.arg_positions[node] == (0,)  # only x is a tensor operand; the shape is part of the key
    deps = {view.graph[d].handle.name: view.graph[d].dtype for d in view.graph[node].deps}
    assert deps == {"x": F32, "n": None}  # n orders the reshape after whatever defines it


def test_prim_value_and_string_arguments_are_attributes_not_nodes():
    """In 0.27 ``clip``'s bounds are tir immediates, subclasses of ``Constant`` like tensor constants."""

    def body(bb, x):
        return bb.emit(R.clip(x, 0, 6), "clipped")

    view, nodes = _view(make_module({"x": ((2, 8), F32)}, body))
    assert [node.op for node in view.graph.nodes] == ["Var", "clip", "DataflowVar"]  # x, clip, output alias
    assert view.arg_positions[nodes["clipped"]] == (0,)
