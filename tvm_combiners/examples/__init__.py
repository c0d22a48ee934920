"""End-to-end examples on the collectives: run each with ``tvm-combiners launch -n N``.

- ``dp_train``: a data-parallel training step (TVM's Gradient and optimizer, one allreduce per
  gradient, bucketed by ``AllReduceCombiner``), checked against one process on the full batch;
- ``pipeline_bert``: MiniLM-L3 split into pipeline stages joined by send/recv, checked against
  onnxruntime.
"""
