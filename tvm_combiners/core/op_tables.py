"""Which ops may follow a combined root, by IR-neutral name (the IR prefix such as ``relax.`` removed).

A follower must compute each output element from the same position of its inputs (elementwise,
numpy broadcasting allowed), so slicing its result equals computing it per branch.
"""

from __future__ import annotations

ELEMENTWISE_UNARY = frozenset(
    {
        "abs", "ceil", "clip", "cos", "erf", "exp", "floor", "log", "negative", "round", "rsqrt",
        "sigmoid", "sin", "sqrt", "square", "tanh",
        "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.softplus", "nn.selu",
        "nn.leakyrelu", "nn.leaky_relu",
        "astype", "cast", "fast_tanh", "fast_exp", "fast_erf",
    }
)

BROADCAST_BINARY = frozenset(
    {"add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "floor_divide", "where"}
)

FOLLOWERS = ELEMENTWISE_UNARY | BROADCAST_BINARY

#: Binary followers whose operands may be swapped between branches: bit for bit, NaNs included.
#: Not ``maximum``/``minimum``: TVM's float maximum(p, q) gives q where p is NaN, so swapping the
#: operands of one branch would move NaNs.
COMMUTATIVE = frozenset({"add", "multiply"})
