"""A private single-node Slurm cluster (munged + slurmctld + slurmd) for tests.

Everything lives under one directory: configuration, munge key and socket, state, spool, logs and
two fake GPUs (character devices cloned from ``/dev/null``, so Slurm sets
``CUDA_VISIBLE_DEVICES``). Daemons run in the foreground as children of this process, on free
ports, so the cluster cannot collide with another Slurm on the host. Must run as root.

With ``accounting=True`` the cluster also keeps job accounting, so ``sacct`` answers: a private
MariaDB server (``mariadb-install-db`` + ``mariadbd`` on a loopback port, its data in the same
directory) and ``slurmdbd`` in front of it. That variant also has two partitions, ``batch``
(the default) and ``urgent`` (a higher priority tier that preempts ``batch`` jobs by requeueing
them), and GPUs are an accounted TRES (``AccountingStorageTRES=gres/gpu``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType

DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")  # in start order
CLIENTS = ("sinfo", "squeue", "scontrol", "sbatch", "scancel")
ACCOUNTING_PROGRAMS = ("mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacct", "sacctmgr")
_SBIN_PATH = "/usr/sbin:/sbin"
_POLL_INTERVAL_SECONDS = 0.1
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
_JOB_STATE = re.compile(r"\bJobState=(\S+)")

SLURM_CONF = """\
ClusterName=gwtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=5
MailProg=/bin/true
GresTypes=gpu
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:2 State=UNKNOWN
"""
# The plain cluster: no accounting, one partition.
PLAIN_CONF = """\
AccountingStorageType=accounting_storage/none
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
# The accounting variant: slurmdbd in front of MariaDB, GPUs accounted, and a partition whose
# jobs preempt (requeue) the default partition's.
ACCOUNTING_CONF = """\
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd_port}
AccountingStoragePass={root}/munge/munge.sock
AccountingStorageTRES=gres/gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10
"""
SLURMDBD_CONF = """\
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
DbdHost={host}
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
PidFile={root}/slurmdbd.pid
LogFile={root}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=slurm
StoragePass={db_password}
StorageLoc=slurm_acct_db
"""
MARIADBD_ARGS = (
    "--no-defaults",
    "--user=root",
    "--datadir={root}/mysql",
    "--socket={root}/mysql.sock",
    "--pid-file={root}/mysqld.pid",
    "--log-error={root}/log/mariadbd.log",
    "--bind-address=127.0.0.1",
    "--port={db_port}",
    "--skip-name-resolve",
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=8M",
    "--performance-schema=OFF",
)
MUNGED_ARGS = (
    "--socket={root}/munge/munge.sock",
    "--key-file={root}/munge/munge.key",
    "--pid-file={root}/munge/munged.pid",
    "--seed-file={root}/munge/munged.seed",
    "--log-file={root}/log/munged.log",
)
GRES_CONF = "NodeName={host} Name=gpu File={root}/dev/nvidia[0-1]\n"


class SlurmClusterError(RuntimeError):
    """The cluster could not start, or a Slurm command failed; the message has the log tails."""


def find_binary(name: str) -> str | None:
    """Locate a Slurm or munge program on ``PATH`` or in the sbin directories."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SBIN_PATH}")


def missing_binaries(*, accounting: bool = False) -> list[str]:
    """Return the programs the cluster (with ``accounting``: its accounting too) needs that are
    not installed."""
    extra = ACCOUNTING_PROGRAMS if accounting else ()
    return [name for name in (*DAEMONS, *CLIENTS, *extra) if find_binary(name) is None]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        return f"--- {path.name}: {error.strerror}"
    return f"--- {path.name}\n" + "\n".join(text.splitlines()[-lines:])


class SlurmCluster:
    """Start, drive and stop a private Slurm cluster.

    Args:
        root: An empty directory for everything, whose ancestors are all world-executable
            (munged refuses its socket otherwise, so pytest's 0700 ``tmp_path`` will not do).
            By default a fresh directory under the system temp dir, removed by ``stop``.
        start_timeout_seconds: How long ``start`` waits for the node to become idle.
        accounting: Also run MariaDB and slurmdbd, so ``sacct`` answers (see the module).
        job_submit_lua: Files of the ``job_submit/lua`` plugin (``job_submit.lua`` and what it
            reads), by name, written next to ``slurm.conf``; given, ``JobSubmitPlugins=lua``.
        partitions: Extra partitions (on every node, never the default) besides the plain
            cluster's ``debug``: e.g. the price tiers a requeue moves jobs between.

    """

    def __init__(
        self,
        root: Path | None = None,
        *,
        start_timeout_seconds: float = 60.0,
        accounting: bool = False,
        job_submit_lua: Mapping[str, str] | None = None,
        partitions: Sequence[str] = (),
    ) -> None:
        if accounting and partitions:
            raise SlurmClusterError("extra partitions go with the plain cluster only")
        self.accounting = accounting
        self.partitions = tuple(partitions)
        self.job_submit_lua = dict(job_submit_lua or {})
        self._fields: dict[str, object] = {}
        self._db_password = ""
        self._owns_root = root is None
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="gwslurm-"))
        self.root = root
        self.conf_path = root / "slurm.conf"
        self.hostname = socket.gethostname().split(".")[0]
        self.start_timeout_seconds = start_timeout_seconds
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        if len(str(root / "munge" / "munge.sock")) > _MAX_SOCKET_PATH:
            msg = f"{root} is too long a path for munge's unix socket"
            raise SlurmClusterError(msg)

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment for Slurm commands: ours, minus any enclosing job's ``SLURM_*``."""
        env = {key: val for key, val in os.environ.items() if not key.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf_path)
        env["PATH"] = f"{env.get('PATH', '')}:{_SBIN_PATH}"
        return env

    def run(self, args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (never through a shell)."""
        result = subprocess.run(
            args, env=self.env(), cwd=self.root, capture_output=True, text=True, check=False
        )
        if check and result.returncode != 0:
            msg = f"{args} exited {result.returncode}: {result.stderr.strip()}\n{self.log_tails()}"
            raise SlurmClusterError(msg)
        return result

    def start(self) -> None:
        """Start munged, slurmctld and slurmd; return once ``sinfo`` shows the node idle."""
        try:
            self._configure()
            munged_args = [arg.format(root=self.root) for arg in MUNGED_ARGS]
            self._spawn("munged", ["munged", "--foreground", *munged_args])
            self._poll((self.root / "munge" / "munge.sock").exists, "munged socket")
            if self.accounting:
                self._start_accounting()
            self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf_path)])
            self._poll(lambda: self.run(["scontrol", "ping"], check=False).returncode == 0, "ctld")
            self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf_path), "-N", self.hostname])
            self._poll(lambda: self.node_state() == "idle", f"node {self.hostname} idle")
        except BaseException:
            self.stop()
            raise

    def _start_accounting(self) -> None:
        """MariaDB (a fresh private data directory), its ``slurm`` user, then slurmdbd and the
        cluster's record in it; returns once ``sacctmgr`` answers."""
        self.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                "--user=root",
                f"--datadir={self.root}/mysql",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ]
        )
        self._spawn("mariadbd", ["mariadbd", *(a.format(**self._fields) for a in MARIADBD_ARGS)])
        sql = (
            f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self._db_password}';"
            " GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )
        client = ["mariadb", "--no-defaults", f"--socket={self.root}/mysql.sock", "-u", "root"]
        self._poll(lambda: self.run([*client, "-e", "SELECT 1"], check=False).returncode == 0, "db")
        self.run([*client, "-e", sql])
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._poll(
            lambda: self.run(["sacctmgr", "-n", "list", "cluster"], check=False).returncode == 0,
            "slurmdbd",
        )
        self.run(["sacctmgr", "-i", "add", "cluster", "gwtest"])

    def add_accounts(self, *accounts: str) -> None:
        """Create Slurm accounts and let root submit to each (accounting clusters only)."""
        self.run(["sacctmgr", "-i", "add", "account", ",".join(accounts)])
        self.run(["sacctmgr", "-i", "add", "user", "root", f"account={','.join(accounts)}"])

    def node_state(self) -> str:
        """Return ``sinfo``'s state for our node (``idle``, ``mixed``, ``down*``, ...)."""
        result = self.run(["sinfo", "-h", "-N", "-n", self.hostname, "-o", "%T"], check=False)
        # One line per partition the node is in; they agree on the node's state.
        return ",".join(sorted(set(result.stdout.split())))

    def sbatch(self, script: str, *args: str) -> str:
        """Submit ``script`` (fed on stdin) with extra ``sbatch`` options; return the job id."""
        jobs = self.root / "jobs"
        options = [f"--chdir={jobs}", f"--output={jobs}/slurm-%j.out", "--parsable", *args]
        result = subprocess.run(
            ["sbatch", *options],
            input=script,
            env=self.env(),
            cwd=jobs,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            msg = f"sbatch {args} exited {result.returncode}: {result.stderr.strip()}\n"
            msg += self.log_tails()
            raise SlurmClusterError(msg)
        return result.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str | None:
        """Return ``JobState`` from ``scontrol show job``, or ``None`` if the job is unknown."""
        result = self.run(["scontrol", "show", "job", "-o", job_id], check=False)
        match = _JOB_STATE.search(result.stdout)
        return match.group(1) if match else None

    def wait_for_state(self, job_id: str, states: Collection[str], timeout_seconds: float) -> str:
        """Poll until the job reaches one of ``states``; return the state reached."""
        seen: list[str | None] = []

        def reached() -> bool:
            seen.append(self.job_state(job_id))
            return seen[-1] in states

        self._poll(reached, f"job {job_id} in {sorted(states)}", timeout_seconds, lambda: seen[-1])
        return str(seen[-1])

    def job_pids(self, job_id: str) -> list[int]:
        """Return the pids of the job's processes (``scontrol listpids``), step daemons excluded."""
        result = self.run(["scontrol", "listpids", job_id], check=False)
        rows = [line.split() for line in result.stdout.splitlines()[1:]]
        return sorted(int(row[0]) for row in rows if row and row[0].isdigit())

    def wait_for_pids(self, job_id: str, count: int, timeout_seconds: float) -> list[int]:
        """Poll until the job runs ``count`` processes (its step starts after ``RUNNING``)."""
        pids: list[int] = []

        def started() -> bool:
            pids[:] = self.job_pids(job_id)
            return len(pids) >= count

        self._poll(started, f"{count} processes of job {job_id}", timeout_seconds, lambda: pids)
        return pids

    def wait_for_exit(self, pids: Collection[int], timeout_seconds: float) -> None:
        """Poll until none of ``pids`` exists any more (ended and reaped)."""

        def gone() -> bool:
            return not any(Path(f"/proc/{pid}").exists() for pid in pids)

        self._poll(gone, f"pids {sorted(pids)} to exit", timeout_seconds)

    def stop(self) -> None:
        """Cancel jobs, stop the daemons and kill anything left that runs under our config."""
        if self._processes.get("slurmctld") is not None and self._alive("slurmctld"):
            self.run(["scancel", "--full", "--user", "root"], check=False)
        for name in reversed(DAEMONS):
            process = self._processes.pop(name, None)
            if process is None:
                continue
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in self._stray_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tails(self) -> str:
        """Return the last lines of every daemon log, for error messages."""
        return "\n".join(_tail(path) for path in sorted((self.root / "log").glob("*")))

    def _configure(self) -> None:
        try:
            socket.gethostbyname(self.hostname)
        except OSError as error:
            msg = f"hostname {self.hostname!r} does not resolve ({error}); add it to /etc/hosts"
            raise SlurmClusterError(msg) from error
        for name in ("munge", "state", "spool", "log", "dev", "jobs"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        for directory in (self.root, self.root / "munge"):
            directory.chmod(0o755)  # munged wants o+x on every directory above its socket
        key = self.root / "munge" / "munge.key"
        # create-munge-key cannot write elsewhere than /etc/munge; the key is random bytes.
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for index in range(2):
            os.mknod(self.root / "dev" / f"nvidia{index}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        ctld_port, slurmd_port, dbd_port, db_port = _free_ports(4)
        cpus = len(os.sched_getaffinity(0))
        self._db_password = os.urandom(12).hex()
        self._fields = {
            "host": self.hostname,
            "root": self.root,
            "cpus": cpus,
            "ctld_port": ctld_port,
            "slurmd_port": slurmd_port,
            "dbd_port": dbd_port,
            "db_port": db_port,
            "db_password": self._db_password,
        }
        extra = ACCOUNTING_CONF if self.accounting else PLAIN_CONF
        conf = SLURM_CONF.format(**self._fields) + extra.format(**self._fields)
        for name in self.partitions:
            conf += f"PartitionName={name} Nodes=ALL MaxTime=INFINITE State=UP\n"
        if self.job_submit_lua:  # slurmctld reads job_submit.lua next to slurm.conf
            conf += "JobSubmitPlugins=lua\n"
            for name, text in self.job_submit_lua.items():
                (self.root / name).write_text(text)
        self.conf_path.write_text(conf)
        (self.root / "gres.conf").write_text(GRES_CONF.format(**self._fields))
        if self.accounting:
            dbd_conf = self.root / "slurmdbd.conf"
            dbd_conf.touch(mode=0o600)  # slurmdbd refuses a config others can read
            dbd_conf.write_text(SLURMDBD_CONF.format(**self._fields))

    def _spawn(self, name: str, args: list[str]) -> None:
        """Run a daemon in the foreground; the program is looked up on ``env()``'s PATH."""
        with (self.root / "log" / f"{name}.stderr").open("wb") as output:
            self._processes[name] = subprocess.Popen(
                args,
                env=self.env(),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )

    def _alive(self, name: str) -> bool:
        process = self._processes.get(name)
        return process is not None and process.poll() is None

    def _poll(
        self,
        done: Callable[[], bool],
        what: str,
        timeout_seconds: float | None = None,
        detail: Callable[[], object] | None = None,
    ) -> None:
        """Call ``done`` until it is true, a daemon dies or the deadline passes."""
        deadline = time.monotonic() + (timeout_seconds or self.start_timeout_seconds)
        while not done():
            dead = [name for name in self._processes if not self._alive(name)]
            if dead or time.monotonic() > deadline:
                last = f" (last: {detail()})" if detail else ""
                reason = f"{', '.join(dead)} exited" if dead else "timed out"
                msg = f"waiting for {what}{last}: {reason}\n{self.log_tails()}"
                raise SlurmClusterError(msg)
            time.sleep(_POLL_INTERVAL_SECONDS)

    def _stray_pids(self) -> list[int]:
        """Pids (not ours) whose environment names our slurm.conf: step daemons and job tasks."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
        return pids
