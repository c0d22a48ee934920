"""Collective ops (allreduce, allgather, reduce_scatter, send/recv) and their combiners.

Not built yet: this is the package's next stage. The IR-neutral pieces it will use already live in
``tvm_combiners.core``: the neutral graph, reachability and ``combine_by_key`` (XLA's
CombineInstructionsByKey), tested on neutral graphs.
"""
