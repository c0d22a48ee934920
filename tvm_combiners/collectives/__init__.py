"""Collective ops (allreduce, allgather, reduce_scatter, send/recv, after_all) in Relax and Relay.

- ``spec``: the ops once, IR-neutral (names, attributes, validation, shape rules);
- ``ordering``: send-before-recv scheduling shared by both IRs' ``OrderSendRecv`` passes;
- ``relax`` / ``relay``: builders, registration, type inference and lowering for each IR
  (``relay`` needs a TVM build with Relay, ``relax`` apache-tvm 0.27);
- ``runtime``: the MPI/NCCL packed functions the ops lower to, and the N-rank launcher;
- ``selfcheck``: every op on N ranks against numpy
  (``tvm-combiners launch -n 4 -- python -m tvm_combiners.collectives.selfcheck --ir relax``).

The IR modules are not imported here: each needs its own TVM generation.
"""
