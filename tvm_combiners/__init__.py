"""Graph passes for Apache TVM: parallel-op combiners and collective ops with their combiners.

``tvm_combiners.relax`` holds the Relax passes (apache-tvm 0.27), ``tvm_combiners.relay`` the
Relay passes (TVM builds that still have Relay), ``tvm_combiners.core`` the IR-neutral
algorithms both are built on; ``tvm_combiners.collectives`` the collective ops, their combiners
and the MPI/NCCL runtime; ``tvm_combiners.compile`` the targets, runners, default schedules and
tuning; ``tvm_combiners.models`` the ONNX loader; ``tvm_combiners.app`` the CLI and the main job.
"""

__version__ = "0.1.0"
