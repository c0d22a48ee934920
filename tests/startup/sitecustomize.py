"""Started in every Python process the tests start (conftest puts this folder on PYTHONPATH): TVM's
import leaves torch out there too, as the CLI's does (:mod:`tvm_combiners.startup`): each rank of a
multi-rank test saves ~3 s of a core. Any other import of torch (a model export) gets torch."""

try:
    from tvm_combiners.startup import keep_torch_out_of_tvm_import
except ImportError:  # an interpreter without the package (a venv a test builds): nothing to do
    pass
else:
    keep_torch_out_of_tvm_import()
