"""Worker processes the schedule pauses, kills and restarts (real executors or naive workers)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devstack.common import PROJECT, PYTHON, free_port
from executor.pause import ENV as PAUSE_ENV

# The schedule's phases -> the shared pause hook's phases (executor.pause). A pause "posted"
# (after the post) has no hook in either worker: it is a SIGSTOP from outside.
PHASE_HOOKS = {
    "locked": "before_claim",
    "claimed": "before_submit",
    "submitted": "before_post",
    "posted": "",
}


def proc_state(pid: int) -> str:
    """The kernel's one-letter state ('T' = stopped), '' when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


@dataclass
class Worker:
    index: int
    generation: int
    owner_id: str
    process: subprocess.Popen
    metrics_port: int | None = None
    pause_requested_at: float | None = None
    pause_seconds: float = 0.0
    pause_phase: str = ""
    stopped_at: float | None = None
    resume_at: float | None = None
    armed: bool = False  # started with DLOCK_EXECUTOR_PAUSE_AT and not stopped yet


@dataclass
class PauseRecord:
    worker: str
    phase: str  # the phase the worker stopped in ("any" when stopped from outside)
    start: float
    end: float | None = None


@dataclass
class WorkerPool:
    """K workers; `spawn(owner_id, metrics_port, extra_env)` starts one. A phase pause uses the
    one pause hook both arms share (`executor.pause`); a phase without a hook is a SIGSTOP from
    outside at the scheduled time."""

    arm: str
    size: int
    spawn: Callable[..., subprocess.Popen]
    clock: Callable[[], float]
    # How a phase pause reaches the worker: "respawn" (replace the victim by a fresh worker armed
    # with DLOCK_EXECUTOR_PAUSE_AT=<phase>:stop, which stops itself at that phase of its first
    # payout), or "outside" (SIGSTOP right now).
    hook: str = "respawn"
    phase_map: dict[str, str] = field(default_factory=lambda: dict(PHASE_HOOKS))
    hook_grace: float = 20.0  # how long a phase pause may wait for the worker to reach the phase
    retiring: list[subprocess.Popen] = field(default_factory=list)
    fallback: bool = True  # stop from outside when a phase pause is not reached in time
    last_paused: str = ""  # owner id of the worker the last pause went to
    workers: dict[int, Worker] = field(default_factory=dict)
    pauses: list[PauseRecord] = field(default_factory=list)
    kills: list[tuple[float, str]] = field(default_factory=list)
    exits: list[tuple[str, int]] = field(default_factory=list)

    def start(self) -> None:
        for i in range(self.size):
            self._spawn(i, 0)

    def _spawn(self, index: int, generation: int, extra_env: dict | None = None) -> Worker:
        owner = f"{self.arm}-w{index}" + (f"-r{generation}" if generation else "")
        port = free_port()
        worker = Worker(index, generation, owner, self.spawn(owner, port, extra_env), port)
        self.workers[index] = worker
        return worker

    def metrics_ports(self) -> list[int]:
        return [w.metrics_port for w in self.workers.values() if w.metrics_port]

    # -- faults ---------------------------------------------------------------------------
    def _busy(self, worker: Worker) -> bool:
        return worker.stopped_at is not None or worker.pause_requested_at is not None

    def _victim(self, index: int) -> Worker | None:
        """The scheduled victim, or the next one that is not already paused."""
        for step in range(self.size):
            worker = self.workers[(index + step) % self.size]
            if not self._busy(worker):
                return worker
        return None

    def pause(self, index: int, phase: str, seconds: float) -> bool:
        """False when the pause must wait: a lapsed lease proves nothing unless a running
        rival takes it over, so at most (K−1)//2 workers (at least one) are paused at once."""
        if sum(self._busy(w) for w in self.workers.values()) >= max(1, (self.size - 1) // 2):
            return False
        worker = self._victim(index)
        if worker is None:
            return False
        target = self.phase_map.get(phase, phase)
        if self.hook == "respawn" and target:
            # The old process finishes (or abandons) its section on SIGTERM and exits.
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGTERM)
            self.retiring.append(worker.process)
            env = {PAUSE_ENV: f"{target}:stop"}
            worker = self._spawn(worker.index, worker.generation + 1, env)
            worker.armed = True
        worker.pause_requested_at = self.clock()
        worker.pause_seconds = seconds
        worker.pause_phase = phase
        self.last_paused = worker.owner_id
        if self.hook == "outside" or not target:
            # no hook for this phase (`posted`): the schedule's phase names the outside stop
            self._stop_now(worker, "any" if self.hook == "outside" else phase)
        return True

    def _stop_now(self, worker: Worker, phase: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.process.pid, signal.SIGSTOP)
        self._stopped(worker, phase)

    def _stopped(self, worker: Worker, phase: str) -> None:
        worker.armed = False
        worker.stopped_at = self.clock()
        worker.resume_at = worker.stopped_at + worker.pause_seconds
        self.pauses.append(PauseRecord(worker.owner_id, phase, worker.stopped_at))

    def kill(self, index: int) -> None:
        # Never the armed victim of a pause that has not landed yet, nor a paused one.
        candidates = [
            self.workers[(index + step) % self.size]
            for step in range(self.size)
            if not self._busy(self.workers[(index + step) % self.size])
            and not self.workers[(index + step) % self.size].armed
        ]
        worker = candidates[0] if candidates else self.workers[index % self.size]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.wait()
        self._clear_pause(worker)
        self.kills.append((self.clock(), worker.owner_id))
        self._spawn(worker.index, worker.generation + 1)

    def _clear_pause(self, worker: Worker) -> None:
        if worker.stopped_at is not None and self.pauses:
            for record in reversed(self.pauses):
                if record.worker == worker.owner_id and record.end is None:
                    record.end = self.clock()
        worker.pause_requested_at = worker.stopped_at = worker.resume_at = None

    def tick(self) -> None:
        """Notice self-stopped workers, fall back to an outside SIGSTOP, resume due ones,
        and replace workers that exited on their own (crash or until-idle)."""
        now = self.clock()
        for worker in list(self.workers.values()):
            if worker.stopped_at is None and worker.pause_requested_at is not None:
                if proc_state(worker.process.pid) == "T":
                    self._stopped(worker, worker.pause_phase)
                elif now - worker.pause_requested_at > self.hook_grace:
                    if self.hook == "respawn":
                        # Still armed: it stops itself whenever it reaches the phase; stop
                        # counting it as paused so the next pause can go ahead.
                        worker.pause_requested_at = None
                    elif self.fallback:
                        self._stop_now(worker, "any")
            if worker.stopped_at is None and worker.pause_requested_at is None:
                if proc_state(worker.process.pid) == "T":  # stopped with no request: never leave it
                    worker.pause_seconds = worker.pause_seconds or 3.0
                    self._stopped(worker, worker.pause_phase or "any")
            if worker.resume_at is not None and now >= worker.resume_at:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signal.SIGCONT)
                for record in reversed(self.pauses):
                    if record.worker == worker.owner_id and record.end is None:
                        record.end = now
                        break
                worker.pause_requested_at = worker.stopped_at = worker.resume_at = None
            if worker.process.poll() is not None:
                self.exits.append((worker.owner_id, worker.process.returncode))
                self._clear_pause(worker)
                self._spawn(worker.index, worker.generation + 1)

    def resume_all(self) -> None:
        """SIGCONT every stopped worker. Armed-but-not-yet-stopped executors keep their request
        (they stop in their phase and tick() resumes them on time)."""
        for worker in self.workers.values():
            if worker.stopped_at is None and proc_state(worker.process.pid) == "T":
                self._stopped(worker, worker.pause_phase or "any")  # stopped itself just now
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGCONT)
            if worker.stopped_at is not None:
                self._clear_pause(worker)
            elif self.hook != "respawn":
                worker.pause_requested_at = None

    def stop_all(self, timeout: float = 25) -> None:
        self.hook = "stopping"
        self.resume_all()
        for proc in self.retiring:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for worker in self.workers.values():
            try:
                worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait()
            self.exits.append((worker.owner_id, worker.process.returncode))


def spawn_executor(
    env: dict[str, str],
    logdir: Path,
    extra_env: dict[str, str] | None = None,
    *,
    concurrency: int | None = None,
):
    """The real executor (issue 7): `ROLE=executor manage.py run_executor --owner-id ID`, with
    `--concurrency N` when given (issue 17: N payouts in flight in one process)."""

    def spawn(owner: str, port: int | None, armed: dict | None = None) -> subprocess.Popen:
        argv = [PYTHON, str(PROJECT / "manage.py"), "run_executor", "--owner-id", owner]
        if concurrency is not None:
            argv += ["--concurrency", str(concurrency)]
        if port:
            argv += ["--metrics-port", str(port)]
        log = open(logdir / f"{owner}.log", "ab")
        return subprocess.Popen(
            argv,
            cwd=PROJECT,
            env={**os.environ, **env, **(extra_env or {}), **(armed or {}), "ROLE": "executor"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    return spawn


def spawn_naive(*, pay_url: str, rail_url: str, run_id: str, lease_ms: int, logdir: Path):
    """The naive worker (`python -m experiment.naive`), armed like the executor when asked."""

    def spawn(owner: str, _port: int | None, armed: dict | None = None) -> subprocess.Popen:
        argv = [
            PYTHON,
            "-m",
            "experiment.naive",
            "--pay-url",
            pay_url,
            "--rail-url",
            rail_url,
            "--run-id",
            run_id,
            "--owner-id",
            owner,
            "--lease-ms",
            str(lease_ms),
        ]
        log = open(logdir / f"{owner}.log", "ab")
        return subprocess.Popen(
            argv,
            cwd=PROJECT,
            env={**os.environ, **(armed or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    return spawn
