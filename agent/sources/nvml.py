"""The NVML GPU source: the only module of the project that imports pynvml.

Every NVML call goes through one choke point, :meth:`NvmlSource._call`, which turns errors into
``None``:

- a call a GPU does not support (NOT_SUPPORTED, or a struct version the driver does not know)
  leaves its metric absent, is logged once per (function, GPU) at WARNING and is not made again;
- a call the library lacks (FUNCTION_NOT_FOUND, or pynvml's ``NVMLLibraryMismatchError``, which
  is not an ``NVMLError``) is the same, logged once for the library and dropped on every GPU;
- any other error leaves the metric absent for the round and is logged once per (function, GPU);
- GPU_IS_LOST, GPU_NOT_FOUND, UNKNOWN or RESET_REQUIRED on a device make that GPU's sample
  FAILED (identity only) while the other GPUs keep reporting. The loss is logged once at ERROR
  and reported once as a ``gpu_lost`` event; while lost, the GPU's handle is re-resolved each
  round and it reports again after one complete round.

Handles, names, UUIDs, PCI bus ids, MIG devices and event registrations are resolved once at
start (and again only after a failure or a MIG configuration change). Each round reads every GPU
with one call per metric and one ``nvmlDeviceGetFieldValues`` batch, then drains XID events with
``nvmlEventSetWait`` timeout 0 until it times out. No threads.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, Final, Self

from gpuwarden.agent.model import GpuEvent, GpuEventKind, GpuSample, GpuStatus, ProcessSample
from gpuwarden.agent.sources import nvml_fields as nf

log = logging.getLogger(__name__)

_FIX: Final = (
    "Install the NVIDIA driver (it provides libnvidia-ml.so.1); or set nvml_library_path in the "
    "agent config (GPUWARDEN_NVML_LIBRARY, --nvml-library) to the absolute path of "
    "libnvidia-ml.so.1; in a container, mount that library into it (NVIDIA container toolkit); "
    "or run with --source simulated."
)
_WHOLE_GPU: Final = -1
_NO_GPU: Final = -1
_MAX_EVENTS_PER_ROUND: Final = 1024
_MAX_PENDING_EVENTS: Final = 4096
_NOTHING: Final[frozenset[int]] = frozenset()

_Key = tuple[object, int, int]  # (query or field, GPU index, MIG position or _WHOLE_GPU)


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used on this node; the message says how to fix it."""


class _GpuLostError(Exception):
    def __init__(self, label: str, error: BaseException) -> None:
        super().__init__(f"{label}: {error}")
        self.label = label
        self.error = error


class _NeverRaisedError(Exception):
    """Stands in for an exception class an injected NVML module does not define."""


@dataclass(eq=False, slots=True)
class _Mig:
    position: int
    handle: Any
    uuid: str
    name: str
    gpu_instance_id: int | None
    compute_instance_id: int | None

    @property
    def profile(self) -> str | None:
        """``"1g.10gb"`` from a MIG device name such as ``"NVIDIA H100 80GB HBM3 MIG 1g.10gb"``."""
        _, sep, profile = self.name.rpartition("MIG ")
        return (profile.strip() or None) if sep else None


@dataclass(eq=False, slots=True)
class _Device:
    """What the source keeps about one GPU between rounds."""

    index: int
    uuid: str
    name: str = "unknown"
    handle: Any = None
    pci_bus_id: str | None = None
    lost: bool = False
    mig_dirty: bool = False
    migs: list[_Mig] = field(default_factory=list)
    fields: list[nf.Field] = field(default_factory=lambda: list(nf.FIELDS))
    last_util_timestamp_us: int = 0
    xid_counts: dict[int, int] = field(default_factory=dict)
    last_xid: int | None = None
    round_xids: set[int] = field(default_factory=set)

    def describe(self, sub: int = _WHOLE_GPU) -> str:
        gpu = f"GPU {self.index} ({self.uuid})"
        return gpu if sub == _WHOLE_GPU else f"MIG device {sub} of {gpu}"


@dataclass(frozen=True, slots=True)
class _Process:
    sample: ProcessSample
    gpu_instance_id: int | None
    compute_instance_id: int | None


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as err:
        msg = "the Python package nvidia-ml-py (module pynvml) is not installed. " + _FIX
        raise NvmlUnavailableError(msg) from err
    module: ModuleType = pynvml
    return module


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def _optional_int(value: object) -> int | None:
    return int(value) if isinstance(value, int) and value != nf.NO_INSTANCE else None


def _handle_key(handle: object) -> object:
    """A hashable identity for a device handle (pynvml hands out a new ctypes pointer each time)."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


def _unavailable_message(what: str, error: BaseException, code: object) -> str:
    reasons = {
        nf.LIBRARY_NOT_FOUND: "the dynamic loader cannot find libnvidia-ml.so.1",
        nf.FUNCTION_NOT_FOUND: "the loaded library is not a usable libnvidia-ml.so.1",
        nf.DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded (check nvidia-smi; "
        "in a container, run it with the NVIDIA container runtime)",
        nf.NO_PERMISSION: "no permission to open /dev/nvidia* (run the agent as root or give "
        "its user access to the devices)",
        nf.LIB_RM_VERSION_MISMATCH: "libnvidia-ml.so.1 and the kernel driver are different "
        "versions (reboot or reload the nvidia module after a driver upgrade; in a container, "
        "mount the host's library)",
    }
    reason = reasons.get(code if isinstance(code, int) else -1, "it failed")
    return f"NVML is unavailable: {what} returned '{error}': {reason}. {_FIX}"


class NvmlSource:
    """Samples every GPU (and MIG device) of the node through NVML.

    Args:
        library_path: Absolute path of ``libnvidia-ml.so.1`` to load instead of the dynamic
            loader's choice (containers often keep it somewhere unusual).
        nvml: The pynvml module, or a stand-in with the same functions; imported lazily by
            default.
        time_ns: Wall clock for XID event timestamps.

    Raises:
        NvmlUnavailableError: NVML cannot be loaded or initialised; the message says how to
            fix it.

    """

    def __init__(
        self,
        *,
        library_path: str | None = None,
        nvml: ModuleType | None = None,
        time_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._nvml: Any = nvml if nvml is not None else _import_pynvml()
        self._nvml_error: type[BaseException] = self._nvml.NVMLError
        self._mismatch_error: type[BaseException] = getattr(
            self._nvml, "NVMLLibraryMismatchError", _NeverRaisedError
        )
        self._time_ns = time_ns
        self._skip: set[_Key] = set()  # refused for one GPU (or MIG device)
        self._missing: set[nf.Query] = set()  # refused by the library itself
        self._logged: set[_Key] = set()
        self._pending: deque[GpuEvent] = deque(maxlen=_MAX_PENDING_EVENTS)
        self._devices: list[_Device] = []
        self._by_handle: dict[object, _Device] = {}
        self._event_set: Any = None
        self._initialised = False
        self._closed = False
        if library_path is not None:
            self._load_library(library_path)
        self._call(nf.INIT, fatal=True)
        self._initialised = True
        try:
            self.driver_version: str | None = _text(self._call(nf.DRIVER_VERSION))
            count = int(self._call(nf.DEVICE_COUNT, fatal=True))
            self._event_set = self._call(nf.EVENT_SET_CREATE)
            for index in range(count):
                self._discover(index)
        except BaseException:
            self.close()
            raise
        log.info(
            "NVML %s: %d GPU(s), %d MIG device(s)",
            self.driver_version,
            len(self._devices),
            sum(len(d.migs) for d in self._devices),
        )

    # --- the GpuSource protocol ---------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        """One sample of every GPU and MIG device; XID events drained first count this round."""
        if self._closed:
            msg = "NvmlSource.sample() after close()"
            raise RuntimeError(msg)
        self._drain_events()
        samples: list[GpuSample] = []
        for device in self._devices:
            samples.extend(self._sample_device(device))
        return samples

    def events(self) -> list[GpuEvent]:
        """XID and GPU-lost events seen by ``sample()`` since the last call."""
        drained = list(self._pending)
        self._pending.clear()
        return drained

    def close(self) -> None:
        """Free the event set and shut NVML down; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._event_set is not None:
            self._call(nf.EVENT_SET_FREE, self._event_set)
            self._event_set = None
        if self._initialised:
            self._call(nf.SHUTDOWN)
            self._initialised = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- the choke point ----------------------------------------------------------------------

    def _call(
        self,
        query: nf.Query,
        *call_args: object,
        device: _Device | None = None,
        sub: int = _WHOLE_GPU,
        quiet: Collection[int] = _NOTHING,
        fatal: bool = False,
    ) -> Any:
        """Call ``query.function(*call_args, *query.args)``; any NVML error becomes ``None``.

        ``quiet`` codes are expected answers (TIMEOUT of an empty event queue, NOT_FOUND of no
        samples) and are not logged. ``fatal`` turns every error into NvmlUnavailableError. A
        lost-GPU code on a ``device`` raises _GpuLostError for the caller to mark the GPU failed.
        """
        key: _Key = (query, device.index if device is not None else _NO_GPU, sub)
        if key in self._skip or query in self._missing:
            return None
        try:
            return getattr(self._nvml, query.function)(*call_args, *query.args)
        except self._mismatch_error as err:
            if fatal:
                raise NvmlUnavailableError(_unavailable_message(query.label, err, None)) from err
            self._missing.add(query)
            self._log_once(
                (query, _NO_GPU, _WHOLE_GPU),
                "NVML library version mismatch: the NVML library lacks the versioned symbol "
                "behind %s (%s); the metric stays absent on every GPU. Upgrade the NVIDIA driver "
                "or install the nvidia-ml-py release that matches it.",
                query.label,
                err,
            )
            return None
        except self._nvml_error as err:
            code = getattr(err, "value", None)
            if fatal:
                raise NvmlUnavailableError(_unavailable_message(query.label, err, code)) from err
            if device is not None and code in nf.LOST_CODES:
                raise _GpuLostError(query.label, err) from err
            if code == nf.FUNCTION_NOT_FOUND:
                # A property of the library, not of one GPU: give up on it everywhere.
                self._missing.add(query)
                key = (query, _NO_GPU, _WHOLE_GPU)
            elif code in nf.PERMANENT_CODES:
                self._skip.add(key)
            if code not in quiet:
                where = ""
                if device is not None and key[1] != _NO_GPU:
                    where = f" on {device.describe(sub)}"
                verdict = "stays" if code in nf.PERMANENT_CODES else "is"
                message = "NVML %s failed%s: %s (code %s); the metric %s absent"
                self._log_once(key, message, query.label, where, err, code, verdict)
            return None

    def _log_once(self, key: _Key, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    # --- start-up -----------------------------------------------------------------------------

    def _load_library(self, library_path: str) -> None:
        try:
            library = ctypes.CDLL(library_path)
        except OSError as err:
            msg = (
                f"cannot load the NVML library {library_path!r} (nvml_library_path): {err}. {_FIX}"
            )
            raise NvmlUnavailableError(msg) from err
        # pynvml keeps the library in a module global and caches function pointers by name.
        self._nvml.nvmlLib = library
        cache = getattr(self._nvml, "_nvmlGetFunctionPointer_cache", None)
        if cache is not None:
            cache.clear()

    def _discover(self, index: int) -> None:
        device = _Device(index=index, uuid=f"nvml-index-{index}")
        try:
            resolved = self._resolve(device)
        except _GpuLostError as lost:
            self._devices.append(device)
            self._mark_lost(device, lost)
            return
        if resolved:
            self._devices.append(device)

    def _resolve(self, device: _Device) -> bool:
        """(Re)read a GPU's handle and static facts; False if NVML gives no handle for it."""
        handle = self._call(nf.HANDLE_BY_INDEX, device.index, device=device)
        if handle is None:
            return False
        device.handle = handle
        device.uuid = _text(self._call(nf.UUID, handle, device=device)) or device.uuid
        device.name = _text(self._call(nf.NAME, handle, device=device)) or device.name
        pci = self._call(nf.PCI_INFO, handle, device=device)
        device.pci_bus_id = _text(getattr(pci, "busId", None)) or device.pci_bus_id
        self._by_handle[_handle_key(handle)] = device
        self._register_events(device)
        self._discover_mig(device)
        return True

    def _register_events(self, device: _Device) -> None:
        if self._event_set is None:
            return
        supported = self._call(nf.SUPPORTED_EVENTS, device.handle, device=device)
        wanted = nf.EVENT_XID_CRITICAL_ERROR | nf.EVENT_MIG_CONFIG_CHANGE
        mask = int(supported or 0) & wanted
        if not mask & nf.EVENT_XID_CRITICAL_ERROR:
            self._log_once(
                (nf.REGISTER_EVENTS, device.index, _WHOLE_GPU),
                "XID events are not supported on %s; xid_counts stay empty",
                device.describe(),
            )
        if mask:
            self._call(nf.REGISTER_EVENTS, device.handle, mask, self._event_set, device=device)

    def _discover_mig(self, device: _Device) -> None:
        device.migs = []
        device.mig_dirty = False
        mode = self._call(nf.MIG_MODE, device.handle, device=device, quiet=nf.PERMANENT_CODES)
        if not mode or int(mode[0]) != nf.MIG_ENABLE:
            return
        count = self._call(nf.MAX_MIG_DEVICES, device.handle, device=device)
        for position in range(int(count or 0)):
            handle = self._call(
                nf.MIG_HANDLE, device.handle, position, device=device, quiet={nf.NOT_FOUND}
            )
            if handle is None:
                continue
            uuid = _text(self._call(nf.UUID, handle, device=device, sub=position))
            name = _text(self._call(nf.NAME, handle, device=device, sub=position))
            gi = self._call(nf.GPU_INSTANCE_ID, handle, device=device, sub=position)
            ci = self._call(nf.COMPUTE_INSTANCE_ID, handle, device=device, sub=position)
            mig = _Mig(
                position=position,
                handle=handle,
                uuid=uuid or f"{device.uuid}/mig-{position}",
                name=name or device.name,
                gpu_instance_id=_optional_int(gi),
                compute_instance_id=_optional_int(ci),
            )
            device.migs.append(mig)
            self._by_handle[_handle_key(handle)] = device

    # --- events -------------------------------------------------------------------------------

    def _drain_events(self) -> None:
        for device in self._devices:
            device.round_xids.clear()
        if self._event_set is None:
            return
        for _ in range(_MAX_EVENTS_PER_ROUND):
            data = self._call(nf.EVENT_WAIT, self._event_set, quiet={nf.TIMEOUT})
            if data is None:
                return
            source = self._by_handle.get(_handle_key(data.device))
            if source is None:
                log.debug("NVML event for an unknown device handle: %s", data)
                continue
            event_type = int(data.eventType)
            if event_type & nf.EVENT_XID_CRITICAL_ERROR:
                self._record_xid(source, int(data.eventData))
            if event_type & nf.EVENT_MIG_CONFIG_CHANGE:
                source.mig_dirty = True

    def _record_xid(self, device: _Device, xid: int) -> None:
        device.xid_counts[xid] = device.xid_counts.get(xid, 0) + 1
        device.last_xid = xid
        device.round_xids.add(xid)
        self._pending.append(
            GpuEvent(gpu_uuid=device.uuid, xid=xid, time_unix_nano=self._time_ns())
        )

    def _mark_lost(self, device: _Device, lost: _GpuLostError) -> None:
        if device.lost:
            return
        device.lost = True
        log.error(
            "%s is lost: NVML %s returned '%s'; reporting it failed until NVML answers again",
            device.describe(),
            lost.label,
            lost.error,
        )
        self._pending.append(
            GpuEvent(device.uuid, None, self._time_ns(), kind=GpuEventKind.GPU_LOST)
        )

    # --- one round ----------------------------------------------------------------------------

    def _sample_device(self, device: _Device) -> list[GpuSample]:
        try:
            if device.lost and not self._resolve(device):
                return self._failed(device)
            if device.mig_dirty:
                self._forget_support(device)
                self._discover_mig(device)
            samples = self._read(device)
        except _GpuLostError as lost:
            self._mark_lost(device, lost)
            return self._failed(device)
        if device.lost:
            device.lost = False
            log.info("%s answers NVML again", device.describe())
        return samples

    def _forget_support(self, device: _Device) -> None:
        """After a MIG reconfiguration, calls NVML refused may work again (and vice versa)."""
        self._skip = {key for key in self._skip if key[1] != device.index}
        self._logged = {key for key in self._logged if key[1] != device.index}
        device.fields = list(nf.FIELDS)

    def _failed(self, device: _Device) -> list[GpuSample]:
        failed, pci = GpuStatus.FAILED, device.pci_bus_id
        gpu = GpuSample(device.uuid, device.index, device.name, status=failed, pci_bus_id=pci)
        migs = [
            GpuSample(m.uuid, device.index, m.name, status=failed, pci_bus_id=pci,
                      parent_uuid=device.uuid, mig_profile=m.profile)
            for m in device.migs
        ]  # fmt: skip
        return [gpu, *migs]

    def _read(self, device: _Device) -> list[GpuSample]:
        handle = device.handle
        values: dict[str, Any] = {}
        util = self._call(nf.UTILIZATION, handle, device=device)
        if util is not None:
            values["utilization_ratio"] = nf.percent(util.gpu)
            values["memory_utilization_ratio"] = nf.percent(util.memory)
        self._read_memory(device, handle, _WHOLE_GPU, values)
        temperature = self._call(nf.TEMPERATURE_V, handle, device=device, quiet=nf.PERMANENT_CODES)
        if temperature is None:
            temperature = self._call(nf.TEMPERATURE, handle, device=device)
        if temperature is not None:
            values["temperature_celsius"] = nf.celsius(temperature)
        for scalar in nf.SCALARS:
            raw = self._call(scalar.query, handle, device=device)
            if raw is not None:
                values[scalar.attribute] = scalar.convert(raw)
        self._read_fields(device, values)
        processes = self._read_processes(device)
        status = self._status(device, values)
        migs: list[GpuSample] = []
        for mig in device.migs:
            mine = [p for p in processes if _runs_on(p, mig)]
            processes = [p for p in processes if not _runs_on(p, mig)]
            migs.append(self._read_mig(device, mig, status, mine))
        gpu = GpuSample(
            uuid=device.uuid,
            index=device.index,
            name=device.name,
            status=status,
            pci_bus_id=device.pci_bus_id,
            xid_counts=dict(device.xid_counts),
            last_xid=device.last_xid,
            processes=tuple(p.sample for p in processes),
            **values,
        )
        return [gpu, *migs]

    def _read_memory(self, device: _Device, handle: Any, sub: int, values: dict[str, Any]) -> None:
        """Memory v2 (used excludes reserved); else v1, whose ``used`` includes reserved."""
        memory = self._call(nf.MEMORY_V2, handle, device=device, sub=sub, quiet=nf.PERMANENT_CODES)
        if memory is not None:
            values["memory_reserved_bytes"] = int(memory.reserved)
        else:
            memory = self._call(nf.MEMORY_V1, handle, device=device, sub=sub)
        if memory is not None:
            values["memory_used_bytes"] = int(memory.used)
            values["memory_total_bytes"] = int(memory.total)

    def _read_fields(self, device: _Device, values: dict[str, Any]) -> None:
        if not device.fields:
            return
        request = [f.request for f in device.fields]
        entries = self._call(nf.FIELD_VALUES, device.handle, request, device=device)
        if entries is None:
            return
        refused: list[nf.Field] = []
        for spec, entry in zip(device.fields, entries, strict=True):
            code = int(entry.nvmlReturn)
            value_type = int(entry.valueType)
            if code == 0 and value_type < len(nf.VALUE_MEMBERS):
                raw = getattr(entry.value, nf.VALUE_MEMBERS[value_type])
                values[spec.attribute] = spec.convert(raw)
                continue
            if code in nf.LOST_CODES:
                raise _GpuLostError(spec.label, self._nvml_error(code))
            if code in nf.PERMANENT_CODES:
                refused.append(spec)
            self._log_once(
                (spec, device.index, _WHOLE_GPU),
                "NVML %s failed on %s: code %d (value type %d); the metric %s absent",
                spec.label,
                device.describe(),
                code,
                value_type,
                "stays" if code in nf.PERMANENT_CODES else "is",
            )
        if refused:
            device.fields = [f for f in device.fields if f not in refused]

    def _read_processes(self, device: _Device) -> list[_Process]:
        """Compute processes joined with their latest utilisation sample since the last round."""
        running = self._call(nf.PROCESSES, device.handle, device=device)
        if not running:
            return []
        utilisation: dict[int, tuple[int, float, float]] = {}
        samples = self._call(
            nf.PROCESS_UTILIZATION,
            device.handle,
            device.last_util_timestamp_us,
            device=device,
            quiet={nf.NOT_FOUND},  # no sample since the timestamp: utilisation unknown
        )
        for s in samples or ():
            timestamp, pid = int(s.timeStamp), int(s.pid)
            if pid not in utilisation or timestamp >= utilisation[pid][0]:
                utilisation[pid] = (timestamp, nf.percent(s.smUtil), nf.percent(s.memUtil))
            device.last_util_timestamp_us = max(device.last_util_timestamp_us, timestamp)
        processes = []
        for p in running:
            pid = int(p.pid)
            memory = p.usedGpuMemory
            _, sm, mem = utilisation.get(pid, (0, None, None))
            sample = ProcessSample(
                pid=pid,
                gpu_memory_bytes=None if memory is None else int(memory),
                sm_utilization_ratio=sm,
                memory_utilization_ratio=mem,
            )
            gi = _optional_int(getattr(p, "gpuInstanceId", None))
            ci = _optional_int(getattr(p, "computeInstanceId", None))
            processes.append(_Process(sample, gi, ci))
        return processes

    def _read_mig(
        self, device: _Device, mig: _Mig, status: GpuStatus, processes: list[_Process]
    ) -> GpuSample:
        """A MIG device: memory and processes; NVML has no utilisation or power per instance."""
        values: dict[str, Any] = {}
        self._read_memory(device, mig.handle, mig.position, values)
        return GpuSample(
            uuid=mig.uuid,
            index=device.index,
            name=mig.name,
            status=status,
            pci_bus_id=device.pci_bus_id,
            parent_uuid=device.uuid,
            mig_profile=mig.profile,
            processes=tuple(p.sample for p in processes),
            **values,
        )

    @staticmethod
    def _status(device: _Device, values: dict[str, Any]) -> GpuStatus:
        """DEGRADED on a failed or pending row remap, or an XID of concern this round."""
        if values.get("remapped_rows_failure") or values.get("remapped_rows_pending"):
            return GpuStatus.DEGRADED
        if device.round_xids & nf.XIDS_OF_CONCERN:
            return GpuStatus.DEGRADED
        return GpuStatus.OK


def _runs_on(process: _Process, mig: _Mig) -> bool:
    return (
        process.gpu_instance_id is not None
        and process.gpu_instance_id == mig.gpu_instance_id
        and process.compute_instance_id in (None, mig.compute_instance_id)
    )
