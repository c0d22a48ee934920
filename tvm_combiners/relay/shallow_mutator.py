"""An ``ExprMutator`` that keeps Python's stack shallow on deep Relay graphs.

TVM's Python ``relay.ExprMutator`` recurses into operands, about four Python frames per op, so a
chain deeper than ~2500 ops (a 48-layer BERT imported to Relay is ~2400 deep) raises
``RecursionError``. Raising the recursion limit instead would trade that error for a C stack
overflow, a segfault. Here ``visit`` first walks the expression with an explicit stack, operands
first, so that by the time a node's ``visit_*`` runs its operands are memoized and each of its
``self.visit`` calls returns at once. Subclasses override ``visit_*`` as usual; a ``visit_*`` that
visits something the walk did not reach (a node elsewhere in the graph) just starts a walk of its own.
"""

from __future__ import annotations

from typing import Any

from tvm import relay


def _operands(expr: Any) -> list[Any]:
    """What ``ExprMutator.visit_*`` visits of ``expr``, in the order it visits them."""
    if isinstance(expr, relay.Call):
        return [expr.op, *expr.args]
    if isinstance(expr, relay.Tuple):
        return list(expr.fields)
    if isinstance(expr, relay.TupleGetItem):
        return [expr.tuple_value]
    if isinstance(expr, relay.Let):
        return [expr.var, expr.value, expr.body]
    if isinstance(expr, relay.If):
        return [expr.cond, expr.true_branch, expr.false_branch]
    if isinstance(expr, relay.Function):
        return [*expr.params, expr.body]
    if isinstance(expr, relay.RefCreate):
        return [expr.value]
    if isinstance(expr, relay.RefRead):
        return [expr.ref]
    if isinstance(expr, relay.RefWrite):
        return [expr.ref, expr.value]
    if isinstance(expr, relay.Match):
        return [expr.data, *(clause.rhs for clause in expr.clauses)]
    return []


class ShallowExprMutator(relay.ExprMutator):
    """``relay.ExprMutator`` with an iterative walk in front of every unmemoized ``visit``."""

    def visit(self, expr: Any) -> Any:
        memo = self.memo_map
        if expr in memo:
            return memo[expr]
        stack: list[tuple[Any, bool]] = [(expr, False)]
        while stack:
            node, ready = stack.pop()
            if node in memo:
                continue
            if ready:
                memo[node] = super().visit(node)
                continue
            stack.append((node, True))
            # reversed: the first operand is popped, and finished, first, as the recursion would
            # (subclasses' side effects, such as reports and numbering, keep their order)
            stack.extend((child, False) for child in reversed(_operands(node)) if child not in memo)
        return memo[expr]
