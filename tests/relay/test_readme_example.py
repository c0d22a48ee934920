"""The README's Relay example, run on a module with three sibling denses."""

from helpers import assert_same_outputs, const, count_ops, make_module, random_inputs
from tvm import relay


def test_the_relay_example_combines_sibling_denses_and_keeps_the_results(readme_block):
    x = relay.var("x", shape=(4, 16))
    before = make_module([relay.nn.relu(relay.nn.dense(x, const((n, 16), n))) for n in (8, 8, 24)], [x])
    scope = {"mod": before}
    exec(readme_block("from tvm_combiners.relay import CombineParallelOps"), scope)
    assert count_ops(before)["nn.dense"] == 3 and count_ops(scope["mod"])["nn.dense"] == 1
    assert_same_outputs(before, scope["mod"], random_inputs(before))
