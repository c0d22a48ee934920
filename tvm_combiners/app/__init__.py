"""The application on top of the package: the ``tvm-combiners`` CLI, the main job and the examples.

Nothing in the package imports this layer; ``python -m tvm_combiners`` runs :mod:`.cli`.
"""
