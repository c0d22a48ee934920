from setuptools import find_packages, setup

setup(
    name="tvm_combiners",
    version="0.1.0",
    description="Graph passes for Apache TVM: parallel-op combiners for Relax and Relay",
    packages=find_packages(include=["tvm_combiners", "tvm_combiners.*"]),
    python_requires=">=3.10",
    install_requires=["numpy", "onnx", "onnxruntime"],
    entry_points={"console_scripts": ["tvm-combiners=tvm_combiners.app.cli:main"]},
)
