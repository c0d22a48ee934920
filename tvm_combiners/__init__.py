"""Graph passes for Apache TVM: parallel-op combiners and (soon) collective combiners.

``tvm_combiners.relax`` holds the Relax passes (apache-tvm 0.27), ``tvm_combiners.relay`` the
Relay passes (TVM builds that still have Relay), ``tvm_combiners.core`` the IR-neutral
algorithms both are built on.
"""

__version__ = "0.1.0"
