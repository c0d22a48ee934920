"""Collective ops (allreduce, allgather, reduce_scatter, send/recv) and their combiners.

Not built yet: this is the package's next stage. The IR-neutral pieces it will use already live in
``tvm_combiners.core`` (the neutral graph and the reachability that combine-by-key needs).
"""
