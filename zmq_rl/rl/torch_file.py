"""Reading a ``torch.save`` file without torch: the tensors of a run's ``policy.pt`` and
checkpoints as numpy arrays, on a host that installed zmq_rl alone (no torch).

``torch.save`` writes a zip archive: ``<name>/data.pkl``, a pickle whose tensors are
persistent references to the raw little-endian storages ``<name>/data/<key>``. This
module unpickles it as ``torch.load(weights_only=True)`` does, with a closed set of
globals: ``collections.OrderedDict``, the tensor rebuilders of ``torch._utils`` and
the typed storages (``torch.FloatStorage`` ...). Nothing is imported and no other
callable is called: any other global unpickles as an inert :class:`Opaque` marker
(an optimiser's state may hold such; a policy never does), so a file crafted to run
code runs none. Tensors become numpy arrays with their shape, strides applied, and
exact dtype (``bfloat16`` has none in numpy: :class:`TorchFileError`).
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Opaque", "TorchFileError", "read_torch_file"]

STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}
"""torch's typed storages by name and the numpy dtype of their elements."""


class TorchFileError(ValueError):
    """Not a ``torch.save`` zip archive this reader understands (the message says why)."""


class Opaque:
    """A global of the pickle that is neither a container nor a tensor (it is never
    imported nor called): ``Opaque("module.name")``, and calling it gives another."""

    def __init__(self, name: str, args: tuple = ()) -> None:
        self.name, self.args = name, args

    def __call__(self, *args: Any, **kwargs: Any) -> Opaque:
        return Opaque(self.name, args)

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"Opaque({self.name!r})"


class _StorageType:
    """A typed storage class of the pickle (``torch.FloatStorage``): its element dtype."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)


def _rebuild_tensor(
    storage: Any, offset: int, size: tuple, stride: tuple, *rest: Any
) -> np.ndarray | Opaque:
    """``torch._utils._rebuild_tensor_v2``: a numpy copy of the strided view."""
    if not isinstance(storage, np.ndarray):
        return Opaque("tensor")
    itemsize = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[int(offset) :], tuple(size), tuple(int(s) * itemsize for s in stride)
    )
    return np.array(view, copy=True)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    """``torch._utils._rebuild_parameter``: the tensor itself."""
    return data


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(file)
        self.archive, self.prefix = archive, prefix
        self.loaded: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(STORAGE_DTYPES[name])
        if module == "torch" and name == "BFloat16Storage":
            raise TorchFileError("it holds bfloat16 tensors, which numpy cannot hold")
        return Opaque(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise TorchFileError(f"an unknown persistent reference {pid!r:.80}")
        _, kind, key, _location, _numel = pid
        if not isinstance(kind, _StorageType):
            return Opaque(f"storage {kind!r}")
        dtype = kind.dtype
        if key not in self.loaded:
            try:
                raw = self.archive.read(f"{self.prefix}data/{key}")
            except KeyError:
                raise TorchFileError(f"storage {key} is missing from the archive") from None
            self.loaded[key] = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype)
        return self.loaded[key]


def read_torch_file(path: str | Path) -> Any:
    """The object ``torch.save`` wrote to ``path`` (dicts, lists, numbers, strings), its
    tensors as numpy arrays. :class:`TorchFileError` for anything else (a file of the
    legacy, non-zip format included) or a truncated archive."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise TorchFileError(f"not a zip archive written by torch.save ({exc})") from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if len(pickles) != 1:
            raise TorchFileError("not an archive written by torch.save: no data.pkl")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = f"{prefix}byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise TorchFileError("its tensors are big-endian")
        try:
            with archive.open(pickles[0]) as file:
                return _Unpickler(file, archive, prefix).load()
        except TorchFileError:
            raise
        except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, ValueError) as exc:
            raise TorchFileError(f"its pickle does not read ({exc})") from None
