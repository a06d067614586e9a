"""Read a torch / DCP pickle as data, without executing it.

`read_pickle(data)` walks the opcodes (``pickletools.genops``) with a small symbolic stack machine
and returns a `PickleScan`: the object tree with every callable left as an inert `Call` record, the
globals it references (GLOBAL, STACK_GLOBAL, INST), the persistent-id storages
(``('storage', <type>, key, location, numel)``) and the tensors built by torch's rebuild functions
(``_rebuild_tensor_v2(storage, offset, size, stride, ...)``). Nothing is imported and nothing is
called: a reference to ``posix.system`` is a name in a list, never a function.

`classify_globals` sorts the referenced names against an allow-list modelled on what
``torch.load(weights_only=True)`` accepts (torch 2.x ``_weights_only_unpickler._get_allowed_globals``
plus the numpy array reconstruction that HF Trainer and Lightning register for their RNG state).
"""

from __future__ import annotations

import math

import _compat_pickle
import pickletools
import re
import reprlib
import struct
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal
from collections.abc import Iterable

# --------------------------------------------------------------------------- dtypes

#: torch dtype name -> bytes per element (sub-byte packed types count whole bytes as torch stores them)
DTYPE_SIZE = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "complex32": 4, "complex64": 8, "complex128": 16,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "bool": 1, "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1, "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    **{f"int{i}": 1 for i in range(1, 8)}, **{f"uint{i}": 1 for i in range(1, 8)},
}

#: legacy storage class (torch.FloatStorage ...) -> element dtype
STORAGE_DTYPE = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
    "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "QInt8Storage": "qint8", "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",  # torch.save of an untyped storage: numel counts bytes
}

# --------------------------------------------------------------------------- allow-list

_STORAGE_CLASSES = set(STORAGE_DTYPE) - {"UntypedStorage"}
_TENSOR_CLASSES = {"FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
                   "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"}
_REBUILD = {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
            "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_sparse_tensor",
            "_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
            "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_device_tensor_from_numpy"}
_QSCHEMES = {"per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
             "per_channel_affine_float_qparams"}

#: exactly what torch.load(weights_only=True) accepts by default (torch 2.13), as "module.name"
WEIGHTS_ONLY = frozenset(
    {"collections.OrderedDict", "collections.Counter", "torch.nn.parameter.Parameter",
     "torch.serialization._get_layout", "torch.Size", "torch.Tensor", "torch.device", "_codecs.encode",
     "builtins.bytearray", "builtins.set", "builtins.complex", "torch._tensor._rebuild_from_type_v2",
     "torch.storage.TypedStorage", "torch.storage.UntypedStorage"}
    | {f"torch.{d}" for d in DTYPE_SIZE} | {f"torch.{q}" for q in _QSCHEMES}
    | {f"torch._utils.{f}" for f in _REBUILD}
    | {f"{m}.{c}" for m in ("torch", "torch.cuda") for c in _STORAGE_CLASSES | _TENSOR_CLASSES}
    | {f"{m}.{c}" for m in ("torch.sparse", "torch.cuda.sparse") for c in _TENSOR_CLASSES - {"BoolTensor"}})

#: what HF Trainer / Lightning add with torch.serialization.add_safe_globals for numpy RNG state
NUMPY_ARRAYS = frozenset(
    {f"{m}.{n}" for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")}
    | {"numpy.ndarray", "numpy.dtype"})
_NUMPY_DTYPE_CLASS = re.compile(r"^numpy\.dtypes\.[A-Za-z0-9]+DType$")

#: torch.distributed.checkpoint's .metadata (read by DCP with pickle.load): its own record classes
DCP_METADATA = re.compile(r"^torch\.distributed\.checkpoint\.(metadata|filesystem|planner|_extension|"
                          r"storage)\.[A-Za-z_][A-Za-z0-9_]*$")
_DCP_EXTRA = frozenset({"pathlib.PosixPath", "pathlib.PurePosixPath", "pathlib.WindowsPath",
                        "pathlib.PureWindowsPath", "pathlib.Path", "torch.contiguous_format",
                        "torch.channels_last", "torch.preserve_format", "torch.strided"})

#: packages whose *classes* a framework pickles as configuration (TrainingArguments, hparams,
#: argparse.Namespace in Megatron): loading them needs weights_only=False, which imports the
#: package, but constructs a data object rather than running a chosen function.
FRAMEWORK_PACKAGES = ("torch", "numpy", "transformers", "accelerate", "pytorch_lightning", "lightning",
                      "lightning_fabric", "deepspeed", "megatron", "nemo", "omegaconf", "peft", "trl",
                      "torchmetrics", "torchtitan", "apex", "timm", "diffusers")
HARMLESS_CLASSES = frozenset({"deepspeed.utils.tensor_fragment.fragment_address",  # a (numel, start) dataclass in every ZeRO save
                              "argparse.Namespace", "pathlib.PosixPath", "pathlib.PurePosixPath",
                              "pathlib.WindowsPath", "pathlib.PureWindowsPath", "pathlib.Path",
                              "datetime.datetime", "datetime.date", "datetime.timedelta", "datetime.timezone",
                              "decimal.Decimal", "uuid.UUID", "builtins.frozenset", "builtins.slice",
                              "builtins.range", "builtins.object", "collections.defaultdict",
                              "collections.deque", "copyreg._reconstructor", "copyreg.__newobj__",
                              "copyreg.__newobj_ex__", "builtins.int", "builtins.float", "builtins.str",
                              "builtins.bytes", "builtins.list", "builtins.dict", "builtins.tuple",
                              "builtins.bool", "enum.Enum"})
#: inside a framework package, names that run code rather than build data: never "framework"
_DANGEROUS_IN_FRAMEWORK = re.compile(r"(^|\.)(load|loads|load_inline|load_state_dict_from_url|hub|jit|_C|"
                                     r"compile|run|runstring|exec|eval|system|popen|import_module|"
                                     r"cpp_extension|_dynamo|_inductor|testing)(\.|$)", re.I)

Verdict = Literal["allowed", "framework", "unsafe"]


def classify_global(qualname: str, dcp: bool = False) -> Verdict:
    """'allowed' (torch weights_only accepts it), 'framework' (a framework's class: needs
    weights_only=False but builds data) or 'unsafe' (anything else: loading would call it)."""
    if qualname in WEIGHTS_ONLY or qualname in NUMPY_ARRAYS or _NUMPY_DTYPE_CLASS.match(qualname):
        return "allowed"
    if dcp and (DCP_METADATA.match(qualname) or qualname in _DCP_EXTRA or qualname in WEIGHTS_ONLY):
        return "allowed"
    if qualname in HARMLESS_CLASSES:
        return "framework"
    module, _, name = qualname.rpartition(".")
    top = module.split(".", 1)[0]
    if (top in FRAMEWORK_PACKAGES and name[:1].isupper() and not _DANGEROUS_IN_FRAMEWORK.search(module)
            and not _DANGEROUS_IN_FRAMEWORK.search(name)):
        return "framework"
    return "unsafe"


def shown(name: str, limit: int = 200) -> str:
    """A tensor name from checkpoint content as printed: control characters escaped (a name with a
    newline cannot forge a line of the report), long names cut."""
    text = name if name.isprintable() else name.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------- symbolic objects

@dataclass(frozen=True)
class Global:
    module: str
    name: str

    @cached_property
    def qualname(self) -> str:
        """module.name, formed once per Global (a pickle memoizes each global: REDUCE asks the same one again)."""
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class Call:
    """`func(*args)` as recorded by REDUCE / NEWOBJ / INST / OBJ: never called. BUILD sets `state`."""

    func: Any
    args: tuple
    state: Any = None
    items: dict = field(default_factory=dict)   # SETITEM(S) on an object (dict subclasses)
    listitems: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.func.qualname if isinstance(self.func, Global) else type(self.func).__name__


def state_of(obj: Any) -> Any:
    """What BUILD gave a recorded object (its pickled state), or the value itself when it is not a Call."""
    return obj.state if isinstance(obj, Call) else obj


@dataclass(frozen=True)
class StorageRef:
    """A persistent-id storage: zip entry `data/<key>` holding `numel` elements of `dtype`."""

    key: str
    dtype: str
    numel: int
    location: str = "cpu"

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZE.get(self.dtype, 1)


@dataclass(eq=False)
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
        last = self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.stride))
        return self.offset, last + 1

    def contiguous(self) -> bool:
        expected = 1
        for d, s in zip(reversed(self.shape), reversed(self.stride)):
            if d != 1 and s != expected:
                return False
            expected *= d
        return True


class Unhashable:
    """A dict key that Python could not hash (a list): kept by identity."""

    def __init__(self, value: Any) -> None:
        self.value = value

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        return f"Unhashable({self.value!r})"


@dataclass
class PickleScan:
    root: Any = None
    globals: list[str] = field(default_factory=list)     # in first-use order, unique
    calls: list[str] = field(default_factory=list)       # callables REDUCE/NEWOBJ'd, unique
    storages: dict[str, StorageRef] = field(default_factory=dict)
    tensors: list[TensorRef] = field(default_factory=list)
    complete: bool = False                                # reached STOP
    error: str | None = None
    text_persistent_ids: int = 0      # PERSID (protocol 0): torch.load asserts its ids are tuples, plain pickle has none
    opcodes: int = 0

    def verdicts(self, dcp: bool = False) -> dict[str, Verdict]:
        return {g: classify_global(g, dcp) for g in self.globals}

    def unsafe(self, dcp: bool = False) -> list[str]:
        return [g for g, v in self.verdicts(dcp).items() if v == "unsafe"]

    def framework(self, dcp: bool = False) -> list[str]:
        return [g for g, v in self.verdicts(dcp).items() if v == "framework"]


_MARK = object()
MAX_OPCODES = 50_000_000


class _Broken(Exception):
    pass


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _storage_from_pid(pid: Any) -> StorageRef | None:
    if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):  # 6: legacy view_metadata
        return None
    stype, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if not isinstance(key, str) or type(numel) is not int or numel < 0:
        return None
    name = stype.name if isinstance(stype, Global) else str(stype)
    dtype = STORAGE_DTYPE.get(name, "uint8" if name in ("TypedStorage",) else "unknown")
    return StorageRef(key=key, dtype=dtype, numel=numel, location=str(location))


def _tuple_ints(v: Any) -> tuple | None:
    if isinstance(v, Call) and isinstance(v.func, Global) and v.func.qualname == "torch.Size" and v.args:
        v = v.args[0]
    if isinstance(v, (tuple, list)):
        for x in v:   # every item an int (not a bool, nor an int subclass), none negative
            if type(x) is not int or x < 0:
                return None
        return v if type(v) is tuple else tuple(v)
    return None


def _apply(scan: PickleScan, func: Any, args: Any) -> Any:
    """The value REDUCE would produce, for the few data-building callables we understand;
    otherwise an inert Call record."""
    if not isinstance(args, tuple):
        args = (args,) if not isinstance(args, list) else tuple(args)
    if isinstance(func, Global):
        q = func.qualname
        if q not in scan.calls:
            scan.calls.append(q)
        if q == "collections.OrderedDict" and not args:
            return {}
        if q in ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v3"):
            if len(args) >= 4 and isinstance(args[0], StorageRef):
                st, offset, shape, stride = args[0], _int(args[1]), _tuple_ints(args[2]), _tuple_ints(args[3])
                dtype = st.dtype
                if q.endswith("_v3") and len(args) >= 7 and isinstance(args[6], Global):
                    dtype = args[6].name
                if offset is not None and offset >= 0 and shape is not None and stride is not None \
                        and len(shape) == len(stride):
                    t = TensorRef(storage=st, offset=offset, shape=shape, stride=stride, dtype=dtype)
                    scan.tensors.append(t)
                    return t
        elif q in ("torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state") and args:
            return args[0]
        elif q == "torch._tensor._rebuild_from_type_v2" and len(args) >= 3 and isinstance(args[2], tuple):
            return _apply(scan, args[0], args[2])
        elif q == "torch.Size" and args and isinstance(args[0], (tuple, list)):
            return tuple(args[0])
        elif q == "_codecs.encode" and args and isinstance(args[0], str):
            return args[0].encode("latin-1", "replace")
    return Call(func, args)


def _setitems(target: Any, pairs: list) -> None:
    d = target.items if isinstance(target, Call) else target
    if not isinstance(d, dict):
        raise _Broken("SETITEM on a non-dict")
    for k, v in pairs:
        try:
            d[k] = v
        except TypeError:
            d[Unhashable(k)] = v


def _append(target: Any, values: list) -> None:
    if isinstance(target, list):
        target.extend(values)
    elif isinstance(target, Call):
        target.listitems.extend(values)
    else:
        raise _Broken("APPEND on a non-list")


class _Machine:
    """read_pickle's state: the stack, the stacks MARK set aside, the memo, the globals seen."""

    def __init__(self, scan: PickleScan) -> None:
        self.scan = scan
        self.stack: list = []
        self.marks: list[list] = []
        self.memo: dict[int, Any] = {}
        self.seen_globals: set[str] = set()

    def pop_mark(self) -> list:
        if not self.marks:
            raise _Broken("no MARK")
        items, self.stack = self.stack, self.marks.pop()
        return items

    def glob(self, module: Any, name: Any) -> Global:
        if not isinstance(module, str) or not isinstance(name, str):
            raise _Broken("non-string global")
        # protocol <= 2 pickles name Python 2 modules; unpicklers (and torch) map them: __builtin__ -> builtins
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        g = Global(module, name)
        if g.qualname not in self.seen_globals:
            self.seen_globals.add(g.qualname)
            self.scan.globals.append(g.qualname)
        return g


# --------------------------------------------------------------------------- one handler per opcode group
# Each takes (machine, opcode name, argument) and reads `m.stack` only after every pop_mark (which swaps the
# stack back to the one below the mark): `m.stack.append(f(m.pop_mark()))` would append to the dropped
# marked stack (a protocol-0 LIST or INST result lost; tests/test_torchpickle_protocols.py).

def _op_skip(m: _Machine, name: str, arg: Any) -> None:
    pass


def _op_mark(m: _Machine, name: str, arg: Any) -> None:
    m.marks.append(m.stack)
    m.stack = []


def _op_pop(m: _Machine, name: str, arg: Any) -> None:
    if name == "POP" and m.stack:
        m.stack.pop()
    else:
        m.pop_mark()


def _op_dup(m: _Machine, name: str, arg: Any) -> None:
    m.stack.append(m.stack[-1])


_CONSTANTS: dict[str, Any] = {"NONE": lambda: None, "NEWTRUE": lambda: True, "NEWFALSE": lambda: False,
                              "EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_TUPLE": tuple, "EMPTY_SET": list}


def _op_constant(m: _Machine, name: str, arg: Any) -> None:
    m.stack.append(_CONSTANTS[name]())


def _op_literal(m: _Machine, name: str, arg: Any) -> None:
    m.stack.append(arg)


def _op_tuple(m: _Machine, name: str, arg: Any) -> None:
    if name in ("TUPLE", "FROZENSET"):
        items = m.pop_mark()
        m.stack.append(tuple(items) if name == "TUPLE" else list(items))
        return
    n = int(name[-1])
    if len(m.stack) < n:
        raise _Broken("stack underflow")
    items = tuple(m.stack[-n:])
    del m.stack[-n:]
    m.stack.append(items)


def _op_list(m: _Machine, name: str, arg: Any) -> None:
    items = list(m.pop_mark())
    m.stack.append(items)


def _op_dict(m: _Machine, name: str, arg: Any) -> None:
    items = m.pop_mark()
    d: dict = {}
    _setitems(d, list(zip(items[::2], items[1::2])))
    m.stack.append(d)


def _op_append(m: _Machine, name: str, arg: Any) -> None:
    if name == "APPEND":
        v = m.stack.pop()
        _append(m.stack[-1], [v])
        return
    items = m.pop_mark()   # APPENDS, ADDITEMS
    _append(m.stack[-1], items)


def _op_setitem(m: _Machine, name: str, arg: Any) -> None:
    if name == "SETITEM":
        v = m.stack.pop()
        k = m.stack.pop()
        _setitems(m.stack[-1], [(k, v)])
        return
    items = m.pop_mark()   # SETITEMS
    _setitems(m.stack[-1], list(zip(items[::2], items[1::2])))


def _op_global(m: _Machine, name: str, arg: Any) -> None:
    if name == "STACK_GLOBAL":
        gname = m.stack.pop()
        module = m.stack.pop()
        m.stack.append(m.glob(module, gname))
        return
    module, _, gname = str(arg).partition(" ")
    g = m.glob(module, gname)
    if name == "GLOBAL":
        m.stack.append(g)
    else:   # INST
        args = tuple(m.pop_mark())
        m.stack.append(_apply(m.scan, g, args))


def _op_ext(m: _Machine, name: str, arg: Any) -> None:
    m.stack.append(m.glob("copyreg", f"extension_{arg}"))


def _op_obj(m: _Machine, name: str, arg: Any) -> None:
    items = m.pop_mark()
    if not items:
        raise _Broken("OBJ without a class")
    m.stack.append(_apply(m.scan, items[0], tuple(items[1:])))


def _op_reduce(m: _Machine, name: str, arg: Any) -> None:
    if name == "NEWOBJ_EX":
        _kwargs = m.stack.pop()
    args = m.stack.pop()
    func = m.stack.pop()   # REDUCE's callable, NEWOBJ(_EX)'s class
    m.stack.append(_apply(m.scan, func, args))


def _op_build(m: _Machine, name: str, arg: Any) -> None:
    state = m.stack.pop()
    target = m.stack[-1]
    if isinstance(target, Call):
        target.state = state


def _op_put(m: _Machine, name: str, arg: Any) -> None:
    if name == "MEMOIZE":
        m.memo[len(m.memo)] = m.stack[-1]
    else:
        m.memo[int(arg)] = m.stack[-1]


def _op_get(m: _Machine, name: str, arg: Any) -> None:
    if int(arg) not in m.memo:
        raise _Broken(f"memo key {arg} used before it was stored")
    m.stack.append(m.memo[int(arg)])


def _op_persid(m: _Machine, name: str, arg: Any) -> None:
    pid = arg if name == "PERSID" else m.stack.pop()
    if name == "PERSID":
        m.scan.text_persistent_ids += 1
    ref = _storage_from_pid(pid)
    if ref is not None:
        prev = m.scan.storages.get(ref.key)
        if prev is None or prev.nbytes < ref.nbytes:
            m.scan.storages[ref.key] = ref
        m.stack.append(ref)
    else:
        m.stack.append(Call(Global("persistent_load", "id"), (pid,)))


def _op_buffer(m: _Machine, name: str, arg: Any) -> None:
    raise _Broken(f"out-of-band buffer opcode {name}")


_LITERALS = ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
             "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
             "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BYTEARRAY8")
_OPCODES: dict[str, Any] = {
    "PROTO": _op_skip, "FRAME": _op_skip, "MARK": _op_mark, "POP": _op_pop, "POP_MARK": _op_pop, "DUP": _op_dup,
    **{n: _op_constant for n in _CONSTANTS}, **{n: _op_literal for n in _LITERALS},
    "TUPLE": _op_tuple, "FROZENSET": _op_tuple, "TUPLE1": _op_tuple, "TUPLE2": _op_tuple, "TUPLE3": _op_tuple,
    "LIST": _op_list, "DICT": _op_dict, "APPEND": _op_append, "APPENDS": _op_append, "ADDITEMS": _op_append,
    "SETITEM": _op_setitem, "SETITEMS": _op_setitem,
    "GLOBAL": _op_global, "INST": _op_global, "STACK_GLOBAL": _op_global, "EXT1": _op_ext, "EXT2": _op_ext,
    "EXT4": _op_ext, "OBJ": _op_obj, "REDUCE": _op_reduce, "NEWOBJ": _op_reduce, "NEWOBJ_EX": _op_reduce,
    "BUILD": _op_build, "PUT": _op_put, "BINPUT": _op_put, "LONG_BINPUT": _op_put, "MEMOIZE": _op_put,
    "GET": _op_get, "BINGET": _op_get, "LONG_BINGET": _op_get, "PERSID": _op_persid, "BINPERSID": _op_persid,
    "NEXT_BUFFER": _op_buffer, "READONLY_BUFFER": _op_buffer,
}


# how `_run_bytes` reads each opcode's argument, by pickletools' argument name (the rest: the genops path)
_ARG_KINDS = {None: 0, "uint1": 1, "uint2": 2, "int4": 3, "uint4": 4, "uint8": 5, "float8": 6, "long1": 7,
              "long4": 8, "bytes1": 9, "bytes4": 10, "bytes8": 11, "string1": 12, "string4": 13,
              "unicodestring1": 14, "unicodestring4": 15, "unicodestring8": 16, "bytearray8": 17,
              "stringnl_noescape_pair": 18}
#: opcode byte -> (pickletools' name, argument kind), for the opcodes `_run_bytes` reads itself
_FAST_OPS: dict[int, tuple[str, int]] = {
    ord(op.code): (op.name, _ARG_KINDS[op.arg.name if op.arg else None]) for op in pickletools.opcodes
    if (op.arg.name if op.arg else None) in _ARG_KINDS}
_LEN_AT = {1: (1, "<B"), 2: (2, "<H"), 3: (4, "<i"), 4: (4, "<I"), 5: (8, "<Q"), 6: (8, ">d")}
_COUNT = {7: (1, "<B"), 8: (4, "<i"), 9: (1, "<B"), 10: (4, "<I"), 11: (8, "<Q"), 12: (1, "<B"), 13: (4, "<i"),
          14: (1, "<B"), 15: (4, "<I"), 16: (8, "<Q"), 17: (8, "<Q")}


#: opcodes `_run_bytes` does without a call: 1 push the argument (`_op_literal`), 2 memo put with an index
#: (`_op_put`), 3 memo get (`_op_get`), 4 MARK (`_op_mark`), 5 STOP, 6 push a constant that is never changed in
#: place (`_op_constant`: None, True, False, the empty tuple), 7 push a new empty dict or list (`_op_constant`),
#: 8 TUPLE (`_op_tuple`: the items above the mark), 9 TUPLE1 / TUPLE2 / TUPLE3 (`_op_tuple`: the top n items);
#: 0: the handler is called. A real AdamW optimizer.pt's data.pkl is ~70 % opcodes of ways 1-9
#: (LONG_BINPUT, BINGET, BININT1, MARK, TUPLE, EMPTY_TUPLE, NEWFALSE, TUPLE1/2, BINUNICODE)
_INLINE = {**{name: 1 for name in _LITERALS}, "BINPUT": 2, "LONG_BINPUT": 2, "BINGET": 3, "LONG_BINGET": 3,
           "MARK": 4, "STOP": 5, "NONE": 6, "NEWTRUE": 6, "NEWFALSE": 6, "EMPTY_TUPLE": 6,
           "EMPTY_DICT": 7, "EMPTY_LIST": 7, "EMPTY_SET": 7, "TUPLE": 8, "TUPLE1": 9, "TUPLE2": 9, "TUPLE3": 9}
#: what ways 6, 7 and 9 push or take, by name: the constant itself (6), the type called for a new one (7), how
#: many items (9); the same as `_CONSTANTS` and `_op_tuple` (tests/test_torchpickle_fastpath.py)
_INLINE_VALUE: dict[str, Any] = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": (),
                                 "EMPTY_DICT": dict, "EMPTY_LIST": list, "EMPTY_SET": list,
                                 "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
#: opcode byte -> (name, argument kind, `_INLINE` way, handler or None, way 6/7/9's value), or None for an opcode
#: `_run_bytes` leaves to genops: one list index per opcode, not two dict lookups (a handler of None fails the
#: call: the pickle is read again by genops, as an opcode without a handler was before)
_FAST_TABLE: list[tuple[str, int, int, Any, Any] | None] = [
    None if (got := _FAST_OPS.get(b)) is None else (got[0], got[1], _INLINE.get(got[0], 0), _OPCODES.get(got[0]),
                                                      _INLINE_VALUE.get(got[0]))
    for b in range(256)]
_U4 = struct.Struct("<I").unpack_from   # LONG_BINPUT / LONG_BINGET (uint4)


# `_run_bytes` returns False on anything it does not take: an opcode or argument it does not read itself, a pickle
# cut short, a handler's objection, a GLOBAL name with an escape or a non-ASCII byte, protocol-4 frames that do not
# follow each other up to STOP, more bytes than `max_opcodes` (every opcode takes at least one, so a pickle no
# longer than that cannot have more and none is counted against it).
def _run_bytes(data: bytes, scan: PickleScan, m: _Machine, max_opcodes: int) -> bool:
    """read_pickle's loop over a pickle held in memory, reading each opcode and its argument as pickletools.genops
    does, with no generator and no file object. True: it reached STOP; False: the caller reads the pickle again
    with genops, which words what is wrong. Branches go by how often a real optimizer.pt's opcodes take them."""
    fast = _FAST_TABLE
    i, n, count, frame_end = 0, len(data), 0, 0   # frame_end: where the current frame ends (0: no frame yet)
    if n > max_opcodes:
        return False
    try:
        while i < n:
            got = fast[data[i]]
            if got is None:
                return False
            name, kind, how, handler, value = got
            if kind == 0:
                i += 1
            elif kind == 1 and i + 1 < n:   # uint1 (BINPUT, BINGET, BININT1)
                arg, i = data[i + 1], i + 2
            elif kind == 4 and i + 4 < n:   # uint4 (LONG_BINPUT, LONG_BINGET)
                arg, i = _U4(data, i + 1)[0], i + 5
            else:
                start, (arg, i) = i, _fast_arg(data, i + 1, n, kind)
                if kind == 5 and (frame_end := _next_frame(frame_end, start, i, arg, n)) < 0:   # FRAME
                    return False
            count += 1
            if how == 2:   # the commonest opcodes, done here as their handlers do them
                m.memo[arg] = m.stack[-1]
            elif how == 3:
                m.stack.append(m.memo[arg])   # (a key never stored: KeyError, read again by genops)
            elif how == 1:
                m.stack.append(arg)
            elif how == 4:
                m.marks.append(m.stack)
                m.stack = []
            elif how == 6:
                m.stack.append(value)
            elif how == 8:   # (no mark: IndexError from the pop, read again by genops)
                items, m.stack = m.stack, m.marks.pop()
                m.stack.append(tuple(items))
            elif how == 0:
                handler(m, name, None if kind == 0 else arg)   # (no handler: None is not callable: genops)
            elif how == 9:   # (too few items: read again by genops, which words the underflow)
                stack = m.stack
                if len(stack) < value:
                    return False
                items = tuple(stack[-value:])
                del stack[-value:]
                stack.append(items)
            elif how == 7:
                m.stack.append(value())
            else:   # 5: STOP
                if frame_end and i != frame_end:   # the last frame ends with STOP, or genops decides
                    return False
                scan.opcodes = count
                scan.root = m.stack.pop() if m.stack else None
                scan.complete = True
                return True
    except Exception:  # noqa: BLE001 - any objection: the genops path reads it again and words it
        return False
    return False


def _next_frame(frame_end: int, start: int, i: int, size: int, n: int) -> int:
    """`_run_bytes` at a FRAME (at `start`, its data from `i`): where it ends, or -1 (genops decides) unless it
    begins where the frame before ended and fits in the pickle."""
    return -1 if size > n - i or frame_end not in (0, start) else i + size


def _fast_arg(data: bytes, i: int, n: int, kind: int) -> tuple[Any, int]:
    """`_run_bytes`' argument of `kind` (_ARG_KINDS) at `i`, and where the next opcode starts; ValueError when it
    is not there whole (or is a GLOBAL line with an escape: genops undoes it)."""
    if kind <= 6:
        size, fmt = _LEN_AT[kind]
        if i + size > n:
            raise ValueError("cut short")
        return struct.unpack_from(fmt, data, i)[0], i + size
    if kind <= 17:
        size, fmt = _COUNT[kind]
        if i + size > n:
            raise ValueError("cut short")
        (k,) = struct.unpack_from(fmt, data, i)
        i += size
        if k < 0 or i + k > n:
            raise ValueError("cut short")
        raw = data[i:i + k]
        return (int.from_bytes(raw, "little", signed=True) if kind <= 8 else raw if kind <= 11
                else raw.decode("latin-1") if kind <= 13 else str(raw, "utf-8", "surrogatepass") if kind <= 16
                else bytearray(raw)), i + k
    j = data.find(b"\n", i)   # GLOBAL / INST: two lines, "module name"
    k = data.find(b"\n", j + 1) if j >= 0 else -1
    raw = data[i:k]
    if k < 0 or b"\\" in raw:   # (a byte that is not ASCII fails the decode)
        raise ValueError("not read here")
    return raw.decode("ascii").replace("\n", " ", 1), k + 1


def read_pickle(data: Any, max_opcodes: int = MAX_OPCODES) -> PickleScan:
    """Interpret a pickle's opcodes symbolically (nothing imported or called) up to STOP.
    `data`: bytes, or a binary file positioned at the pickle (left just after its STOP). Bytes go through
    `_run_bytes` first; a pickle it does not take whole is read again with pickletools.genops."""
    if isinstance(data, bytes):
        scan = PickleScan()
        if _run_bytes(data, scan, _Machine(scan), max_opcodes):
            return scan
    scan = PickleScan()
    m = _Machine(scan)
    end = len(data) if isinstance(data, bytes) else _end_of(data)
    frame: list = [None]   # where the current frame ends
    try:
        for op, arg, _pos in pickletools.genops(data):
            scan.opcodes += 1
            if scan.opcodes > max_opcodes:
                raise _Broken(f"more than {max_opcodes} opcodes")
            name = op.name
            frame = _frame_check(frame, name, arg, _pos, end)
            if name == "STOP":
                scan.root = m.stack.pop() if m.stack else None
                scan.complete = True
                break
            handler = _OPCODES.get(name)
            if handler is None:
                raise _Broken(f"unsupported opcode {name}")
            handler(m, name, arg)
    except _Broken as exc:
        scan.error = str(exc)
    except IndexError:
        scan.error = "stack underflow (not a valid pickle)"
    except (ValueError, TypeError, KeyError) as exc:  # genops on garbage / a truncated stream
        scan.error = " ".join(str(exc).split())[:100] or type(exc).__name__
    if not scan.complete and scan.error is None:
        scan.error = "ends without STOP (truncated)"
    return scan


def _frame_check(frame: list, name: str, arg: Any, pos: int | None, end: int | None) -> list:
    """Protocol 4 frames as pickle.load reads them: a frame is read whole before its first opcode (one longer than
    the rest of the pickle is refused) and no opcode runs across its end (the unpickler refuses, or reads
    garbage). `frame`: [where the current frame ends, or None]; the new state."""
    frame_end = frame[0]
    if pos is None:
        return frame
    if frame_end is not None and pos >= frame_end:
        if pos != frame_end:
            raise _Broken(f"an opcode runs across the end of a FRAME at byte {frame_end}")
        frame_end = None
    if name == "FRAME":
        if end is not None and arg > end - pos - 9:
            raise _Broken(f"a FRAME of {arg} bytes runs past the end of the pickle")
        if frame_end is not None:
            raise _Broken("a FRAME begins inside another")
        frame_end = pos + 9 + arg
    return [frame_end]


def _end_of(fh: Any) -> int | None:
    """Where a seekable binary file ends (genops numbers its opcodes by file position), or None."""
    try:
        here = fh.tell()
        end = fh.seek(0, 2)
        fh.seek(here)
        return end
    except (AttributeError, OSError, ValueError):
        return None


# --------------------------------------------------------------------------- walking the tree

def walk_tensors(obj: Any, prefix: str = "", _depth: int = 0, _seen: set | None = None) -> Iterable[tuple[str, TensorRef]]:
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
    if isinstance(obj, (dict, list, tuple, Call)):
        _seen.add(id(obj))
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = k.value if isinstance(k, Unhashable) else k
            yield from walk_tensors(v, f"{prefix}.{key}" if prefix else str(key), _depth + 1, _seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk_tensors(v, f"{prefix}.{i}" if prefix else str(i), _depth + 1, _seen)
    elif isinstance(obj, Call):
        for i, v in enumerate(obj.args):
            yield from walk_tensors(v, f"{prefix}.{i}" if prefix else str(i), _depth + 1, _seen)
        if obj.state is not None:
            yield from walk_tensors(obj.state, prefix, _depth + 1, _seen)
        if obj.items:
            yield from walk_tensors(obj.items, prefix, _depth + 1, _seen)
