"""Read a torch / DCP pickle as data, without executing it: the package's one pickle reader.

`read_pickle(data)` runs the standard library's C unpickler with the "Restricting Globals" pattern of the pickle
documentation taken to the end: `find_class` hands back this module's own inert `Global` for every name (nothing is
imported or looked up) and `persistent_load` a `StorageRef`, so REDUCE, NEWOBJ, BUILD and SETITEMS only ever reach
records made here. It returns a `PickleScan`: the object tree with every callable left as an inert `Call` record, the
globals it references (GLOBAL, STACK_GLOBAL, INST), the persistent-id storages
(``('storage', <type>, key, location, numel)``) and the tensors built by torch's rebuild functions
(``_rebuild_tensor_v2(storage, offset, size, stride, ...)``). A reference to ``posix.system`` is a name in a list and
a class of this module, never a function. What Python's unpickler refuses (an odd SETITEMS, a FRAME inside a frame,
a BUILD state it cannot set) this reader refuses the same way, with the unpickler's own words.

Bounds, checked before the C unpickler runs (it has no hooks inside): the pickle's size (`MAX_PICKLE_BYTES`); memo
indices (its memo is an array grown to twice the largest index stored: a pickle with a byte that could be a
LONG_BINPUT or PUT of a large index, found by one regular expression, has its opcodes walked first, runs of them
matched by another in C, to refuse an index past the pickle's length); tuple nesting (a
dict key's hash recurses in C once per level: a pickle with many tuple opcodes is read in a thread with the stack for
it and refused past MAX_TUPLE_DEPTH); the objects recorded (`MAX_RECORDS`). Every other object the unpickler makes
comes from at least one byte of input: memory stays proportional to the pickle (docs/checkpoints.md).

`classify_globals` sorts the referenced names against an allow-list modelled on what
``torch.load(weights_only=True)`` accepts (torch 2.x ``_weights_only_unpickler._get_allowed_globals``
plus the numpy array reconstruction that HF Trainer and Lightning register for their RNG state).
"""

from __future__ import annotations

import _compat_pickle
import io
import math
import pickle
import pickletools
import re
import reprlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

# --------------------------------------------------------------------------- dtypes

#: torch dtype name -> bytes per element (sub-byte packed types count whole bytes as torch stores them)
DTYPE_SIZE = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
    "quint4x2": 1,
    "quint2x4": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "bits8": 1,
    "bits16": 2,
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
    **{f"int{i}": 1 for i in range(1, 8)},
    **{f"uint{i}": 1 for i in range(1, 8)},
}

#: legacy storage class (torch.FloatStorage ...) -> element dtype
STORAGE_DTYPE = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "QInt8Storage": "qint8",
    "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",  # torch.save of an untyped storage: numel counts bytes
}

# --------------------------------------------------------------------------- allow-list

_STORAGE_CLASSES = set(STORAGE_DTYPE) - {"UntypedStorage"}
_TENSOR_CLASSES = {
    "FloatTensor",
    "DoubleTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "LongTensor",
    "IntTensor",
    "ShortTensor",
    "CharTensor",
    "ByteTensor",
    "BoolTensor",
}
_REBUILD = {
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor",
    "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_cpu_tensor",
    "_rebuild_device_tensor_from_numpy",
}
_QSCHEMES = {
    "per_tensor_affine",
    "per_tensor_symmetric",
    "per_channel_affine",
    "per_channel_symmetric",
    "per_channel_affine_float_qparams",
}

#: exactly what torch.load(weights_only=True) accepts by default (torch 2.13), as "module.name"
WEIGHTS_ONLY = frozenset(
    {
        "collections.OrderedDict",
        "collections.Counter",
        "torch.nn.parameter.Parameter",
        "torch.serialization._get_layout",
        "torch.Size",
        "torch.Tensor",
        "torch.device",
        "_codecs.encode",
        "builtins.bytearray",
        "builtins.set",
        "builtins.complex",
        "torch._tensor._rebuild_from_type_v2",
        "torch.storage.TypedStorage",
        "torch.storage.UntypedStorage",
    }
    | {f"torch.{d}" for d in DTYPE_SIZE}
    | {f"torch.{q}" for q in _QSCHEMES}
    | {f"torch._utils.{f}" for f in _REBUILD}
    | {f"{m}.{c}" for m in ("torch", "torch.cuda") for c in _STORAGE_CLASSES | _TENSOR_CLASSES}
    | {
        f"{m}.{c}"
        for m in ("torch.sparse", "torch.cuda.sparse")
        for c in _TENSOR_CLASSES - {"BoolTensor"}
    }
)

#: what HF Trainer / Lightning add with torch.serialization.add_safe_globals for numpy RNG state
NUMPY_ARRAYS = frozenset(
    {
        f"{m}.{n}"
        for m in ("numpy.core.multiarray", "numpy._core.multiarray")
        for n in ("_reconstruct", "scalar")
    }
    | {"numpy.ndarray", "numpy.dtype"}
)
_NUMPY_DTYPE_CLASS = re.compile(r"^numpy\.dtypes\.[A-Za-z0-9]+DType$")

#: torch.distributed.checkpoint's .metadata (read by DCP with pickle.load): its own record classes
DCP_METADATA = re.compile(
    r"^torch\.distributed\.checkpoint\.(metadata|filesystem|planner|_extension|"
    r"storage)\.[A-Za-z_][A-Za-z0-9_]*$"
)
_DCP_EXTRA = frozenset(
    {
        "pathlib.PosixPath",
        "pathlib.PurePosixPath",
        "pathlib.WindowsPath",
        "pathlib.PureWindowsPath",
        "pathlib.Path",
        "torch.contiguous_format",
        "torch.channels_last",
        "torch.preserve_format",
        "torch.strided",
    }
)

#: packages whose *classes* a framework pickles as configuration (TrainingArguments, hparams,
#: argparse.Namespace in Megatron): loading them needs weights_only=False, which imports the
#: package, but constructs a data object rather than running a chosen function.
FRAMEWORK_PACKAGES = (
    "torch",
    "numpy",
    "transformers",
    "accelerate",
    "pytorch_lightning",
    "lightning",
    "lightning_fabric",
    "deepspeed",
    "megatron",
    "nemo",
    "omegaconf",
    "peft",
    "trl",
    "torchmetrics",
    "torchtitan",
    "apex",
    "timm",
    "diffusers",
)
HARMLESS_CLASSES = frozenset(
    {
        "deepspeed.utils.tensor_fragment.fragment_address",  # a (numel, start) dataclass in every ZeRO save
        "argparse.Namespace",
        "pathlib.PosixPath",
        "pathlib.PurePosixPath",
        "pathlib.WindowsPath",
        "pathlib.PureWindowsPath",
        "pathlib.Path",
        "datetime.datetime",
        "datetime.date",
        "datetime.timedelta",
        "datetime.timezone",
        "decimal.Decimal",
        "uuid.UUID",
        "builtins.frozenset",
        "builtins.slice",
        "builtins.range",
        "builtins.object",
        "collections.defaultdict",
        "collections.deque",
        "copyreg._reconstructor",
        "copyreg.__newobj__",
        "copyreg.__newobj_ex__",
        "builtins.int",
        "builtins.float",
        "builtins.str",
        "builtins.bytes",
        "builtins.list",
        "builtins.dict",
        "builtins.tuple",
        "builtins.bool",
        "enum.Enum",
    }
)
#: inside a framework package, names that run code rather than build data: never "framework"
_DANGEROUS_IN_FRAMEWORK = re.compile(
    r"(^|\.)(load|loads|load_inline|load_state_dict_from_url|hub|jit|_C|"
    r"compile|run|runstring|exec|eval|system|popen|import_module|"
    r"cpp_extension|_dynamo|_inductor|testing)(\.|$)",
    re.I,
)

Verdict = Literal["allowed", "framework", "unsafe"]


def classify_global(qualname: str, dcp: bool = False) -> Verdict:
    """'allowed' (torch weights_only accepts it), 'framework' (a framework's class: needs
    weights_only=False but builds data) or 'unsafe' (anything else: loading would call it).
    (Every list it reads is frozen: the verdicts of up to `_GLOBALS_CACHED` names are kept.)"""
    verdict = _VERDICTS.get((qualname, dcp))
    if verdict is None:
        verdict = _classify(qualname, dcp)
        if len(_VERDICTS) < _GLOBALS_CACHED:
            _VERDICTS[qualname, dcp] = verdict
    return verdict


_VERDICTS: dict[tuple[str, bool], Verdict] = {}


def _classify(qualname: str, dcp: bool) -> Verdict:
    if qualname in WEIGHTS_ONLY or qualname in NUMPY_ARRAYS or _NUMPY_DTYPE_CLASS.match(qualname):
        return "allowed"
    if dcp and (DCP_METADATA.match(qualname) or qualname in _DCP_EXTRA or qualname in WEIGHTS_ONLY):
        return "allowed"
    if qualname in HARMLESS_CLASSES:
        return "framework"
    module, _, name = qualname.rpartition(".")
    top = module.split(".", 1)[0]
    if (
        top in FRAMEWORK_PACKAGES
        and name[:1].isupper()
        and not _DANGEROUS_IN_FRAMEWORK.search(module)
        and not _DANGEROUS_IN_FRAMEWORK.search(name)
    ):
        return "framework"
    return "unsafe"


def shown(name: str, limit: int = 200) -> str:
    """A tensor name from checkpoint content as printed: control characters escaped (a name with a
    newline cannot forge a line of the report), long names cut."""
    text = name if name.isprintable() else name.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------- records: what a pickle builds


def _storage_dtype(name: str) -> str:
    return STORAGE_DTYPE.get(name) or ("uint8" if name == "TypedStorage" else "unknown")


class Global(type):
    """A global a pickle names (GLOBAL, STACK_GLOBAL, INST), as the inert class this module makes for it: its
    `module` and `name` are text, nothing is imported. Calling it (REDUCE, INST, OBJ) or NEWOBJ on it builds a `Call`
    record of the arguments (or, for the few data-building callables torch uses, the value they build: `_build`)."""

    _where: tuple[str, str, str]
    _storage_dtype: str

    def __new__(mcs, module: str, name: str) -> Global:
        cls = super().__new__(mcs, "Record", (Call,), {"__slots__": ()})
        cls._where = (module, name, f"{module}.{name}")
        # the dtype of a storage this global names as a persistent id's storage type (`_Reader.persistent_load`)
        cls._storage_dtype = _storage_dtype(name)
        return cls

    def __init__(
        cls, module: str, name: str
    ) -> None:  # (type.__init__ wants a class statement's 3 arguments)
        super().__init__("Record", (Call,), {})

    # __call__ (REDUCE, and INST / OBJ with arguments) is `_build`, set below

    @property
    def module(cls) -> str:
        return cls._where[0]

    @property
    def name(cls) -> str:
        return cls._where[1]

    @property
    def qualname(cls) -> str:
        return cls._where[2]

    def __eq__(cls, other: object) -> bool:
        return isinstance(other, Global) and other._where == cls._where

    def __hash__(cls) -> int:
        return hash(cls._where)

    def __repr__(cls) -> str:
        return f"Global({cls.module!r}, {cls.name!r})"


class Call:
    """`func(*args)` as recorded by REDUCE / NEWOBJ / INST / OBJ: never called. BUILD sets `state`, SETITEM(S) on
    the object fill `items`, APPEND(S) `listitems`; `func` is the object's `Global` (its class)."""

    __slots__ = ("args", "kwargs", "state", "items", "listitems")
    args: tuple
    kwargs: dict
    state: Any
    items: dict
    listitems: list

    # __new__ (NEWOBJ(_EX), and INST / OBJ without arguments) is `_build`, set below

    @property
    def func(self) -> Global:
        return type(self)  # type: ignore[return-value]

    @property
    def name(self) -> str:
        return type(self)._where[2]  # type: ignore[attr-defined]

    def __setstate__(self, state: Any) -> None:  # BUILD
        self.state = state

    def __setitem__(
        self, key: Any, value: Any
    ) -> None:  # SETITEM(S) on an object (dict subclasses)
        self.items[key] = value

    def append(self, value: Any) -> None:  # APPEND(S) on an object (list subclasses)
        self.listitems.append(value)

    def extend(self, values: list) -> None:
        self.listitems.extend(values)

    def __repr__(self) -> str:
        return f"Call({self.name}, {reprlib.repr(self.args)})"


class OrderedDictRecord(dict):
    """`collections.OrderedDict()`, built as a dict: BUILD keeps the attributes it sets (a state_dict's `_metadata`)
    on `state` as Python's unpickler would set them on an OrderedDict (a mapping, or nothing)."""

    __slots__ = ("state",)

    def __setstate__(self, state: Any) -> None:
        if state is not None and not isinstance(state, dict):
            raise pickle.UnpicklingError("state is not a dictionary")
        self.state = state


def state_of(obj: Any) -> Any:
    """What BUILD gave a recorded object (its pickled state), or the value itself when it is not a Call."""
    return obj.state if isinstance(obj, Call) else obj


@dataclass(slots=True)
class StorageRef:
    """A persistent-id storage: zip entry `data/<key>` holding `numel` elements of `dtype`."""

    key: str
    dtype: str
    numel: int
    location: str = "cpu"

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZE.get(self.dtype, 1)

    def __setstate__(
        self, state: Any
    ) -> None:  # BUILD on it: nothing to set (as the walker before did)
        pass


@dataclass(eq=False, slots=True)
class TensorRef:
    """A tensor rebuilt from a storage: `shape`/`stride` in elements, `offset` in elements of `dtype`."""

    storage: StorageRef
    offset: int
    shape: tuple
    stride: tuple
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def span(self) -> tuple[int, int] | None:
        """(first, last+1) element index inside the storage, or None when the view is empty."""
        if self.numel == 0:
            return None
        last = self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.stride, strict=True))
        return self.offset, last + 1

    def contiguous(self) -> bool:
        expected = 1
        for d, s in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if d != 1 and s != expected:
                return False
            expected *= d
        return True

    def __setstate__(
        self, state: Any
    ) -> None:  # BUILD on a tensor: its state is not what this reader checks
        pass


@dataclass
class PickleScan:
    root: Any = None
    globals: list[str] = field(default_factory=list)  # in first-use order, unique
    calls: list[str] = field(default_factory=list)  # callables REDUCE/NEWOBJ'd, unique
    storages: dict[str, StorageRef] = field(default_factory=dict)
    tensors: list[TensorRef] = field(default_factory=list)
    complete: bool = False  # reached STOP
    error: str | None = None
    text_persistent_ids: int = (
        0  # PERSID (protocol 0): torch.load asserts its ids are tuples, plain pickle has none
    )
    records: int = 0  # objects recorded (Call records, storages, tensors)
    past_end: TensorRef | None = (
        None  # the first tensor whose view runs past the end of its storage
    )

    def verdicts(self, dcp: bool = False) -> dict[str, Verdict]:
        return {g: classify_global(g, dcp) for g in self.globals}

    def unsafe(self, dcp: bool = False) -> list[str]:
        if not self.globals:  # (a pickle of plain values: no verdict to make)
            return []
        return [g for g, v in self.verdicts(dcp).items() if v == "unsafe"]

    def framework(self, dcp: bool = False) -> list[str]:
        return [g for g, v in self.verdicts(dcp).items() if v == "framework"]


# --------------------------------------------------------------------------- building records


class _Refused(Exception):
    """A pickle this reader will not read further (a bound it passes): the message says which."""


#: the read in progress on this thread (the records' classes are shared, so what they record goes here)
_current = threading.local()
_GLOBALS: dict[tuple[str, str], Global] = {}
_GLOBALS_CACHED = (
    4096  # distinct globals kept across reads (a hostile pickle cannot grow the cache more)
)
MAX_RECORDS = 20_000_000  # objects recorded in one pickle


def _global(module: str, name: str) -> Global:
    g = _GLOBALS.get((module, name))
    if g is None:
        g = _KINDS.get(f"{module}.{name}", Global)(module, name)
        if len(_GLOBALS) < _GLOBALS_CACHED:
            _GLOBALS[module, name] = g
    return g


def _build(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """What calling (or NEWOBJ on) the recorded class `cls` with `args` gives: the value torch's few data-building
    callables would build, else a new inert `Call` record. Nothing named by the pickle runs. (It is Global.__call__
    and Call.__new__ itself: one Python call for each REDUCE or NEWOBJ the C unpickler makes.)"""
    if type(cls) is _TensorGlobal:  # (NEWOBJ on a rebuild function: as calling it)
        return _tensor(cls, *args, **kwargs)
    scan: PickleScan = _current.scan
    scan.records += 1
    if scan.records > MAX_RECORDS:
        raise _Refused(f"more than {MAX_RECORDS} objects")
    q = cls._where[2]
    if q not in scan.calls:
        scan.calls.append(q)
    if q == "collections.OrderedDict" and not args and not kwargs:  # (INST / OBJ / NEWOBJ of one)
        return OrderedDictRecord()
    maker = _MAKERS.get(q)
    if maker is not None:
        made = maker(scan, args)
        if made is not _NOT_MADE:
            return made
    rec = object.__new__(cls)
    rec.args, rec.kwargs, rec.state, rec.items, rec.listitems = args, kwargs, None, {}, []
    return rec


Global.__call__ = _build  # type: ignore[method-assign,assignment]
Call.__new__ = staticmethod(_build)  # type: ignore[method-assign]


def _record(cls: Any, args: tuple, kwargs: dict | None = None) -> Call:
    rec = object.__new__(cls)
    rec.args, rec.kwargs, rec.state, rec.items, rec.listitems = args, kwargs or {}, None, {}, []
    return rec


_NOT_MADE = object()


def _tensor(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """torch._utils._rebuild_tensor(_v2/_v3)(storage, offset, size, stride, ...) as a `TensorRef`, counted as `_build`
    counts a record (`_TensorGlobal.__call__`: one Python call a tensor); arguments it does not take, a `Call`."""
    scan: PickleScan = _current.scan
    scan.records += 1
    if scan.records > MAX_RECORDS:
        raise _Refused(f"more than {MAX_RECORDS} objects")
    q = cls._where[2]
    if q not in scan.calls:
        scan.calls.append(q)
    if len(args) < 4:
        return _record(cls, args, kwargs)
    st, offset, shape, stride = args[0], args[1], args[2], args[3]
    if (
        type(shape) is not tuple or type(stride) is not tuple
    ):  # (torch writes tuples: the rest is the slow way)
        shape, stride = _tuple_ints(shape), _tuple_ints(stride)
        if shape is None or stride is None:
            return _record(cls, args, kwargs)
    if (
        type(st) is not StorageRef
        or type(offset) is not int
        or offset < 0
        or len(shape) != len(stride)
    ):
        return _record(cls, args, kwargs)
    last = offset  # (TensorRef.span inlined: the last element the view reads)
    for d, s in zip(shape, stride):  # noqa: B905 - lengths equal; each an int (not a bool, nor a subclass), >= 0
        if type(d) is not int or type(s) is not int or d < 0 or s < 0:
            return _record(cls, args, kwargs)
        last += (d - 1) * s
    t = _new_tensor(
        TensorRef
    )  # (its fields set here: a dataclass __init__ is one more Python call)
    t.storage = st
    t.offset = offset
    t.shape = shape
    t.stride = stride
    dtype = st.dtype
    if len(args) >= 7 and isinstance(args[6], Global):
        dtype = args[6]._where[1]
    t.dtype = dtype
    scan.tensors.append(t)
    if (
        scan.past_end is None
        and 0 not in shape  # (an empty view reads nothing)
        and last
        >= (
            st.numel
            if dtype is st.dtype
            else st.numel * DTYPE_SIZE.get(st.dtype, 1) // max(1, DTYPE_SIZE.get(dtype, 1))
        )
    ):
        scan.past_end = t
    return t


_new_tensor = object.__new__


def _make_from_type(scan: PickleScan, args: tuple) -> Any:
    """torch._tensor._rebuild_from_type_v2(func, type, args, state): what `func(*args)` builds."""
    if len(args) >= 3 and isinstance(args[0], Global) and isinstance(args[2], tuple):
        return _build(args[0], *args[2])
    return _NOT_MADE


_MAKERS: dict[str, Callable[[PickleScan, tuple], Any]] = {
    **{
        f"torch._utils.{f}": (lambda scan, a: a[0] if a else _NOT_MADE)
        for f in ("_rebuild_parameter", "_rebuild_parameter_with_state")
    },
    "torch._tensor._rebuild_from_type_v2": _make_from_type,
    "torch.Size": lambda scan, a: (
        tuple(a[0]) if a and isinstance(a[0], (tuple, list)) else _NOT_MADE
    ),
    "_codecs.encode": lambda scan, a: (
        a[0].encode("latin-1", "replace") if a and isinstance(a[0], str) else _NOT_MADE
    ),
    "collections.OrderedDict": lambda scan, a: _NOT_MADE if a else OrderedDictRecord(),
}


class _TensorGlobal(Global):
    """The global of one of torch's tensor rebuild functions: calling it (REDUCE) is `_tensor`."""

    __call__ = _tensor


def _ordered_dict(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """``collections.OrderedDict()`` (torch writes one for each tensor's backward hooks) as an `OrderedDictRecord`,
    counted as `_build` counts a record (`_DictGlobal.__call__`); with arguments, `_build`'s record of them."""
    if args or kwargs:
        return _build(cls, *args, **kwargs)
    scan: PickleScan = _current.scan
    scan.records += 1
    if scan.records > MAX_RECORDS:
        raise _Refused(f"more than {MAX_RECORDS} objects")
    if "collections.OrderedDict" not in scan.calls:
        scan.calls.append("collections.OrderedDict")
    return OrderedDictRecord()


class _DictGlobal(Global):
    """``collections.OrderedDict``: calling it (REDUCE) is `_ordered_dict`."""

    __call__ = _ordered_dict


#: the globals whose class is not `Global` itself
_KINDS: dict[str, type[Global]] = {
    **{
        f"torch._utils.{f}": _TensorGlobal
        for f in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3")
    },
    "collections.OrderedDict": _DictGlobal,
}


def _tuple_ints(v: Any) -> tuple | None:
    if type(v) is tuple:  # (what torch writes: checked first)
        for x in v:
            if type(x) is not int or x < 0:
                return None
        return v
    if isinstance(v, Call) and v.name == "torch.Size" and v.args:
        v = v.args[0]
    if isinstance(v, (tuple, list)):
        for x in v:  # every item an int (not a bool, nor an int subclass), none negative
            if type(x) is not int or x < 0:
                return None
        return v if type(v) is tuple else tuple(v)
    return None


class _Reader(pickle.Unpickler):
    """The standard library's C unpickler with the "Restricting Globals" pattern of the pickle documentation taken to
    the end: `find_class` returns this module's own inert `Global` for every name (never imports or looks anything
    up) and `persistent_load` a `StorageRef`; so REDUCE / NEWOBJ / BUILD / SETITEMS only ever reach the records above."""

    # (set by `_unpickle` after the C type's own __init__: a Python __init__ calling super() costs a tiny pickle's
    # read ~0.5 us more)
    scan: PickleScan
    seen: set[tuple[str, str]]

    def find_class(self, module: str, name: str) -> Global:
        # protocol <= 2 pickles name Python 2 modules; unpicklers (and torch) map them: __builtin__ -> builtins
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if (module, name) not in self.seen:
            self.seen.add((module, name))
            self.scan.globals.append(f"{module}.{name}")
        return _global(module, name)

    def persistent_load(self, pid: Any) -> Any:
        scan = self.scan
        scan.records += 1
        if (
            type(pid) is tuple and len(pid) in (5, 6) and pid[0] == "storage"
        ):  # 6: legacy view_metadata
            key, numel = pid[2], pid[4]
            if isinstance(key, str) and type(numel) is int and numel >= 0:
                stype, location = pid[1], pid[3]
                ref = _new_tensor(StorageRef)  # (as in _tensor: no __init__ call)
                ref.key = key
                ref.numel = numel
                ref.dtype = (
                    stype._storage_dtype
                    if isinstance(stype, Global)
                    else _storage_dtype(str(stype))
                )
                ref.location = location if type(location) is str else str(location)
                prev = scan.storages.get(key)
                if prev is None or prev.nbytes < ref.nbytes:
                    scan.storages[key] = ref
                return ref
        elif type(pid) is str:
            scan.text_persistent_ids += 1
        return _record(_global("persistent_load", "id"), (pid,))


# --------------------------------------------------------------------------- bounds, before the C unpickler runs

MAX_PICKLE_BYTES = 256 << 20
#: a memo index up to this (or up to the pickle's length) is taken without a look: the C unpickler's memo is an array
#: grown to twice the largest index stored, so one LONG_BINPUT of 2**32 - 1 would take 64 GB
_MEMO_FREE = 1 << 16
#: nested tuples: hashing one (a dict key) recurses in C once per level, ~55 bytes of stack each; 8 MB ends near
#: 150 000 levels. A pickle with fewer tuple-building opcode bytes than this cannot nest deeper
_TUPLE_OPS_FREE = 50_000
_TUPLE_OPS_MAX = 8_000_000
MAX_TUPLE_DEPTH = 10_000
_TUPLE_OPS = (b"t", b"\x85", b"\x86", b"\x87")
#: an 'r' (LONG_BINPUT) whose next 4 bytes, read as its index, are 2**16 or more; a 'p' (PUT) before 5 or more digits
#: (two expressions: each starts with its literal byte, which the regular expression engine searches for fast)
_SUSPECT_R = re.compile(rb"r(?=[\s\S]{2}(?!\x00\x00))")
_SUSPECT_P = re.compile(rb"p(?=[ \t\r\x0b\x0c]*[+-]?[0-9_]{5})")
#: BINUNICODE8, BINBYTES8, BYTEARRAY8, as byte values: `byte in data` with an int is one memchr, while a one-byte
#: bytes needle first raises and clears a TypeError inside bytes.__contains__ (~1k instructions a test)
_SUSPECT_8 = (0x8D, 0x8E, 0x96)


def _opcode_table() -> tuple[bytes, dict[int, tuple[int, bool]], frozenset[int], frozenset[int]]:
    """From pickletools' opcode list: the size of each opcode with a fixed-size argument (0: any other), the counted
    ones (width of their length field, signed), the ones taking a line and the ones taking two (GLOBAL, INST)."""
    step = bytearray(256)
    counted: dict[int, tuple[int, bool]] = {}
    lines: set[int] = set()
    pairs: set[int] = set()
    widths = {
        pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
        pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
        pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
        pickletools.TAKEN_FROM_ARGUMENT8U: (8, False),
    }
    for op in pickletools.opcodes:
        code, n = op.code.encode("latin-1")[0], op.arg.n if op.arg else 0
        if n >= 0 and op.name not in ("LONG_BINPUT", "STOP", "FRAME"):
            step[code] = 1 + n
        elif n in widths:
            counted[code] = widths[n]
        elif n == pickletools.UP_TO_NEWLINE:
            (
                pairs if op.arg is not None and op.arg.name == "stringnl_noescape_pair" else lines
            ).add(code)
    return bytes(step), counted, frozenset(lines), frozenset(pairs)


_STEP, _COUNTED, _LINES, _PAIRS = _opcode_table()
_COUNTED8 = frozenset(
    op for op, (width, _signed) in _COUNTED.items() if width == 8
)  # BINUNICODE8, BINBYTES8, ...
_OP_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}


def _suspect_in(data: bytes) -> bool:
    """Whether `data` holds a byte that could be a LONG_BINPUT or PUT of an index past `_MEMO_FREE`, or an opcode with
    an 8-byte length (`_SUSPECT_R`, `_SUSPECT_P`, `_SUSPECT_8`; in a real pickle: text inside strings)."""
    return (
        _SUSPECT_R.search(data) is not None
        or _SUSPECT_P.search(data) is not None
        or _SUSPECT_8[0] in data
        or _SUSPECT_8[1] in data
        or _SUSPECT_8[2] in data
    )


#: string and integer arguments up to this long are stepped over inside `_RUN` (one branch per length)
_RUN_LENGTHS = 64


def _run_expression() -> re.Pattern[bytes]:
    """A run of opcodes `_walk_refusal` steps over without a look, as one regular expression (matched in C): every
    fixed-size opcode of `_STEP`, a LONG_BINPUT of an index under `_MEMO_FREE`, a PUT of at most 4 digits, a counted
    argument (1- or 4-byte length field) up to `_RUN_LENGTHS` bytes, a line or two. It ends before any other opcode
    (an 8-byte length, FRAME, STOP, a longer argument, an opcode the unpickler refuses), which the walk takes.
    Each opcode's way starts with its own bytes (one way at most matches at a place): the engine's cost is per way
    tried, so the commonest in a torch.save pickle come first, and four opcodes are one turn of the loop."""

    def one_of(codes: Iterable[int]) -> bytes:
        return b"[" + b"".join(re.escape(bytes([c])) for c in sorted(codes)) + b"]"

    sizes: dict[int, set[int]] = {}
    for code, k in enumerate(_STEP):
        if k:
            sizes.setdefault(k, set()).add(code)
    counted = {}
    for width in (1, 4):
        codes = [op for op, (w, _signed) in _COUNTED.items() if w == width]
        lengths = b"|".join(
            re.escape(n.to_bytes(width, "little")) + (b".{%d}" % n if n else b"")
            for n in range(_RUN_LENGTHS)
        )
        counted[width] = one_of(codes) + b"(?:" + lengths + b")"
    hot = set(b"hKq")  # BINGET, BININT1, BINPUT
    ways = [
        one_of(hot) + b".",
        b"r..\x00\x00",  # (0x72: LONG_BINPUT, its index < 2**16)
        counted[4],
        one_of(sizes.pop(5)) + b".{4}",
        counted[1],
        one_of(sizes.pop(2) - hot) + b".",
    ]
    single = one_of(sizes.pop(1)) + b"*+"  # (a run of 1-byte opcodes: one tight loop in the engine)
    ways += [one_of(codes) + b".{%d}" % (k - 1) for k, codes in sorted(sizes.items())]
    ways += [
        one_of(_LINES - {0x70}) + b"[^\n]*\n",
        one_of(_PAIRS) + b"[^\n]*\n[^\n]*\n",
        b"p[0-9]{1,4}\n",
    ]  # (PUT, its index < 10**4)
    one = single + b"(?:" + b"|".join(ways) + b")"
    return re.compile(b"(?:" + one * 4 + b")*+(?:" + one + b")*+" + single, re.DOTALL)


_RUN = _run_expression()


def _walk_refusal(data: bytes, frames: list[int] | None = None, fast: bool = False) -> str | None:
    """Why the memo indices of `data` are refused (one past the pickle's length), or None: the opcodes walked in
    Python as the unpickler reads them, up to STOP or to what the unpickler would refuse first; where a FRAME
    opcode is met is added to `frames`. `fast`: the runs of opcodes `_RUN` matches are stepped over in C (the
    same steps: the tests hold the two walks equal)."""
    bound = max(_MEMO_FREE, len(data))
    i, n, step = 0, len(data), _STEP
    frames = [] if frames is None else frames
    run = _RUN.match if fast else None
    while i < n:
        if run is not None:
            i = run(data, i).end()  # type: ignore[union-attr]   # (a possessive run: it matches, maybe empty)
            if i >= n:
                break
        k = step[data[i]]
        if k:
            i += k
            continue
        got = _step(data, i, bound, frames)
        if type(got) is not int:
            return got  # type: ignore[return-value]   # (a refusal, or None: the walk ends there)
        i = got
    return None


def _step(data: bytes, i: int, bound: int, frames: list[int]) -> int | str | None:
    """`_walk_refusal`'s step over the opcode at `i` that has no fixed size: where the next one starts, why the pickle
    is refused, or None (the unpickler reads nothing after it: STOP, an opcode it refuses, a cut-short argument)."""
    op, n = data[i], len(data)
    if op == 0x72:  # LONG_BINPUT
        if int.from_bytes(data[i + 1 : i + 5], "little") > bound:
            return _too_big(int.from_bytes(data[i + 1 : i + 5], "little"), i)
        return i + 5
    if op == 0x95:  # FRAME (its 8-byte length: the opcodes inside are walked as they come)
        frames.append(i)
        return i + 9
    if op in _COUNTED:
        width, signed = _COUNTED[op]
        size = int.from_bytes(data[i + 1 : i + 1 + width], "little", signed=signed)
        if size < 0 or size > n - i - 1 - width:
            return _length_refusal(op, size, n - i - 1 - width, i)
        return i + 1 + width + size
    if op in _LINES or op in _PAIRS:
        end = data.find(b"\n", i + 1)
        end = data.find(b"\n", end + 1) if op in _PAIRS and end >= 0 else end
        if end < 0:
            return None
        if op == 0x70 and not _small_put(data[i + 1 : end], bound):
            return _too_big(data[i + 1 : end], i)
        return end + 1
    return None  # STOP, or an opcode the unpickler refuses: it reads nothing further


def _length_refusal(op: int, size: int, left: int, at: int) -> str | None:
    """None (the unpickler refuses a negative or cut-short length itself, reading nothing after it), or why an
    8-byte length is refused (`_check_length`)."""
    try:
        if op in _COUNTED8:
            _check_length(op, size, left, at)
    except _Refused as exc:
        return str(exc)
    return None


def _too_big(index: Any, at: int) -> str:
    text = index.decode("latin-1") if isinstance(index, bytes) else str(index)
    return f"memo index {shown(text, 30)} at byte {at}: more than the pickle could hold"


def _check_length(op: int, size: int, left: int, at: int) -> None:
    """An 8-byte length the unpickler would allocate before reading (a MemoryError there prints a SystemError of its
    own on stderr): refused when more than the pickle holds."""
    if size > left:
        raise _Refused(
            f"{_OP_NAMES[op]} of {size} bytes at byte {at}: more than the {left} left in the pickle"
        )


def _small_put(text: bytes, bound: int) -> bool:
    try:
        return int(text) <= bound
    except ValueError:
        return False  # (a line Python's int() does not take: refused rather than guessed at)


def _tuple_depth(root: Any) -> int:
    """The deepest nesting of tuples in `root`, without recursion."""
    deepest, todo, seen = 0, [(root, 0)], set()
    while todo:
        obj, depth = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, tuple):
            depth += 1
            deepest = max(deepest, depth)
        if isinstance(obj, (tuple, list, set, frozenset)):
            todo.extend((v, depth) for v in obj)
        elif isinstance(obj, dict):
            todo.extend((v, depth) for kv in obj.items() for v in kv)
        elif isinstance(obj, Call):
            todo.extend((v, depth) for v in (obj.args, obj.state, obj.items, obj.listitems))
    return deepest


# --------------------------------------------------------------------------- reading

_BROKEN = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
    MemoryError,
    RecursionError,
    _Refused,
)


def read_pickle(data: Any, max_bytes: int = MAX_PICKLE_BYTES) -> PickleScan:
    """Read a pickle as inert records (nothing imported or called) up to STOP, with the C unpickler.
    `data`: bytes, or a seekable binary file positioned at the pickle (left just after its STOP). Refused with one
    reason in `error`: more than `max_bytes`, a memo index past what the pickle could hold, tuples nested deeper than
    MAX_TUPLE_DEPTH, more than MAX_RECORDS objects, or anything Python's unpickler refuses."""
    if type(data) is bytes:
        return _read(data, max_bytes)[0]
    if isinstance(data, (bytes, bytearray)):
        return _read(bytes(data), max_bytes)[0]
    return _read_file(data, max_bytes)


def _read(data: bytes, max_bytes: int) -> tuple[PickleScan, int]:
    """`data`'s pickle as records, and where it ends (just after its STOP; 0 when it was not read)."""
    scan = PickleScan()
    if len(data) > max_bytes:
        scan.error = f"a pickle of {len(data)} bytes: more than the {max_bytes} this reader takes"
        return scan, 0
    frames = [0] if 0x95 in data else []  # FRAME (an int: see _SUSPECT_8)
    if _suspect_in(data):  # the opcodes walked (runs of them in C) before the unpickler runs
        frames = []
        scan.error = _walk_refusal(data, frames, fast=True)
        if scan.error is not None:
            return scan, 0
    # torch.load hands the unpickler a BytesIO (no peek: a read() call per opcode, and a FRAME's unread bytes are
    # dropped when a read runs past it, as a damaged frame length shows); with no FRAME opcode (none walked, or no
    # 0x95 byte at all) both read the same bytes in the same order, so the pickle is handed over buffered whole
    # (from _BUFFERED_FROM bytes: the buffer costs a tiny pickle more than its few reads)
    buffered = not frames and len(data) >= _BUFFERED_FROM
    fh = io.BufferedReader(io.BytesIO(data), len(data)) if buffered else io.BytesIO(data)
    if len(data) <= _TUPLE_OPS_FREE:  # (`_load`'s first case: too short to count its tuple opcodes)
        _unpickle(fh, scan)
    else:
        _load(fh, scan, data)
    return scan, fh.tell() if scan.complete else 0


_BUFFERED_FROM = 512


def _load(fh: Any, scan: PickleScan, data: bytes) -> None:
    """Unpickle from `fh` into `scan` within the depth bound (a pickle longer than _TUPLE_OPS_FREE bytes: a shorter
    one cannot hold more tuple opcodes, `_read` unpickles it)."""
    tuple_ops = sum(data.count(b) for b in _TUPLE_OPS)
    if tuple_ops > _TUPLE_OPS_MAX:
        scan.error = f"{tuple_ops} tuple opcodes: more than the {_TUPLE_OPS_MAX} this reader takes"
        return
    if tuple_ops <= _TUPLE_OPS_FREE:
        _unpickle(fh, scan)
        return
    # tuples may nest deep: hashed in a thread with the stack for it, then measured before anyone hashes them
    _in_deep_stack(lambda: _unpickle(fh, scan), 64 * tuple_ops + (16 << 20))
    if scan.complete and _tuple_depth(scan.root) > MAX_TUPLE_DEPTH:
        scan.root, scan.complete = None, False
        scan.error = f"tuples nested more than {MAX_TUPLE_DEPTH} deep"


def _unpickle(fh: Any, scan: PickleScan) -> None:
    _current.scan = scan
    try:
        reader = _Reader(fh)
        reader.scan, reader.seen = scan, set()
        scan.root = reader.load()
        scan.complete = True
    except _BROKEN as exc:
        scan.error = " ".join(str(exc).split())[:120] or type(exc).__name__
    finally:
        _current.scan = None


def _in_deep_stack(run: Callable[[], None], stack: int) -> None:
    old = threading.stack_size(min(stack, 1 << 30))
    try:
        worker = threading.Thread(target=run, name="torchpickle-deep")
        worker.start()
    finally:
        threading.stack_size(old)
    worker.join()


def _read_file(fh: Any, max_bytes: int) -> PickleScan:
    """A pickle read from a file at its position: read in growing pieces until one holds the whole pickle (or
    `max_bytes` are read), then the file is left just after its STOP."""
    start = fh.tell()
    size = 1 << 16
    while True:
        fh.seek(start)
        data = fh.read(min(size, max_bytes + 1))
        scan, end = _read(data, max_bytes)
        if scan.complete or len(data) < size or len(data) > max_bytes:
            break
        size *= 4
    if scan.complete:
        fh.seek(start + end)
    return scan


def frame_refusal(data: bytes) -> str | None:
    """Why a pickle's protocol and frames are not what Python's unpickler takes from a writer that frames whole
    (dcp.save's `.metadata`), or None: protocol at most 5, and from protocol 4 on FRAME records (opcode 0x95, an
    8-byte length) that chain from byte 2 to the end (only a string or bytes value of 64 KB or more goes unframed,
    which no .metadata holds). A protocol 0/1 pickle has no PROTO and no frames: None (the read decides)."""
    if data[:1] != b"\x80" or len(data) < 2:
        return None
    if data[1] > 5:
        return f"pickle protocol {data[1]}: Python reads 0-5"
    at = 2
    while data[1] >= 4 and at < len(data) and data[at] == 0x95:
        if at + 9 > len(data):
            return "a FRAME record cut short"
        at += 9 + int.from_bytes(data[at + 1 : at + 9], "little")
    if data[1] >= 4 and at != len(data):
        return f"its FRAME lengths end at byte {at}, the pickle at {len(data)}"
    return None


# --------------------------------------------------------------------------- walking the tree


def walk_tensors(
    obj: Any, prefix: str = "", _depth: int = 0, _seen: set | None = None
) -> Iterable[tuple[str, TensorRef]]:
    """(dotted name, tensor) for every tensor in the object tree (dict keys and list indexes
    joined with '.'), each tensor once."""
    if _seen is None:
        _seen = set()
    if _depth > 200 or id(obj) in _seen:
        return
    if isinstance(obj, TensorRef):
        _seen.add(id(obj))
        yield prefix, obj
        return
    if isinstance(obj, (dict, list, tuple, set, frozenset, Call)):
        _seen.add(id(obj))
        for name, child in _children(obj, prefix):
            yield from walk_tensors(child, name, _depth + 1, _seen)


def _children(obj: Any, prefix: str) -> Iterable[tuple[str, Any]]:
    """The items of a container or record under their dotted names (a record's state and items under its own)."""
    if isinstance(obj, dict):
        items: Iterable[tuple[Any, Any]] = obj.items()
    elif isinstance(obj, Call):
        items = enumerate(obj.args)
    else:
        items = enumerate(obj)
    for key, child in items:
        yield (f"{prefix}.{key}" if prefix else str(key)), child
    if isinstance(obj, Call):
        yield from ((prefix, v) for v in (obj.state, obj.items) if v)
