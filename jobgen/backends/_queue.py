"""How many jobs Slurm lets this user queue now: the limits a sweep meets before the controller refuses
its jobs, read as they apply to the user, and the jobs each of them counts.

- MaxJobCount (slurm.conf): every job record the controller holds, every user's, ended jobs included
  until MinJobAge has passed (and the next purge); each array task counts one.
- The QOS's MaxSubmitJobsPerUser (the user's queued jobs in that QOS) and GrpSubmitJobs (everyone's), and
  the association's MaxSubmitJobs (the user's queued jobs under that account): read with sacctmgr, and
  only where slurm.conf's AccountingStorageEnforce enforces limits (else Slurm ignores them).

A job counts as queued while it is pending, running or suspended; array tasks one each (`squeue -r`).
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from jobgen.backends import _tools as slurm
from jobgen.errors import SubmitError
from jobgen.states import State, from_slurm

BUSY = slurm.BUSY
# What sbatch prints when a QOS or association limit refuses the job.
POLICY = "Job violates accounting/QOS policy"
DEFAULT_MAX_JOB_COUNT = 10_000  # Slurm's default when slurm.conf says nothing
_ENFORCED = ("limits", "safe", "all")  # AccountingStorageEnforce words under which submit limits hold


@dataclass(frozen=True)
class Limit:
    """One limit on queued jobs, as it applies to this user now."""

    name: str  # Slurm's name: MaxJobCount, MaxSubmitJobsPerUser, GrpSubmitJobs, MaxSubmitJobs
    where: str  # where it is set: "slurm.conf", "QOS normal", "association root/alice"
    value: int
    counted: int  # jobs it counts now
    counts: str  # what those are, in words
    # Slots the controller keeps back: measured on Slurm 22.05, with MaxJobCount = 12 and no job held,
    # the 12th job is refused while squeue lists 11.
    held_back: int = 0

    @property
    def room(self) -> int:
        return max(0, self.value - self.held_back - self.counted)

    def describe(self) -> str:
        return f"{self.where} {self.name} = {self.value}, {self.counted} {self.counts}"


@dataclass(frozen=True)
class QueueRoom:
    """The limits that apply to the user's next jobs, the user's queued jobs, and what could not be read."""

    limits: tuple[Limit, ...]
    queued: int  # the user's jobs pending, running or suspended (array tasks one each)
    unread: tuple[str, ...] = ()  # one line per limit that could not be read, and why

    @property
    def room(self) -> int | None:
        """How many more jobs fit now (None: no limit known)."""
        return min((limit.room for limit in self.limits), default=None)

    @property
    def binding(self) -> Limit | None:
        """The limit that leaves the least room."""
        return min(self.limits, key=lambda limit: limit.room, default=None)

    def fit_line(self, wanted: int) -> str:
        """One line: how many of `wanted` jobs (array tasks one each) fit now, and by which limit."""
        tight = self.binding
        unread = f"; not read: {'; '.join(self.unread)}" if self.unread else ""
        if tight is None:
            return f"queue: no limit on queued jobs known (you have {self.queued} queued){unread}"
        room = tight.room
        said = f"{tight.describe()}; you have {self.queued} queued"
        if room >= wanted:
            return f"queue: all {wanted} job(s) fit now ({said}; room for {room}){unread}"
        return (
            f"queue: {room} of the {wanted} job(s) fit now ({said}); the rest wait for room: submit in waves "
            f"(launch.max_queued), or sweep fewer points{unread}"
        )


def max_queued(asked: int, reserve: int, room: QueueRoom | None) -> int | None:
    """The most of a sweep's jobs queued at once: `asked` when the user set launch.max_queued, else the
    room the limits leave now less `reserve` (half the room where MaxJobCount binds: the records of
    ended jobs stay until MinJobAge passes), at least 1; None when nothing limits it."""
    if asked:
        return asked
    if room is None or room.binding is None:
        return None
    binding = room.binding
    if binding.name == "MaxJobCount":
        return max(1, binding.room // 2 - reserve)
    return max(1, binding.room - reserve)


def user() -> str | None:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, OSError):
        return None


@dataclass(frozen=True)
class _Queued:
    user: str
    state: State
    qos: str
    account: str


def _jobs(me: str = "") -> list[_Queued] | None:
    """Every job record the controller holds (ended ones too), array tasks one each: every user's, or
    `me`'s alone (a question the controller answers from that user's jobs)."""
    out = slurm.ask(["squeue", "-h", "-r", "-t", "all", *(["-u", me] if me else []), "-o", "%u|%T|%q|%a"])
    if out is None:
        return None
    jobs = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 4:
            jobs.append(_Queued(parts[0], from_slurm(parts[1]), parts[2], parts[3]))
    return jobs


def _active(job: _Queued) -> bool:
    return not job.state.is_final


@dataclass(frozen=True)
class _Rule:
    """A submit limit as sacctmgr gives it, before its jobs are counted."""

    name: str
    where: str
    value: int
    counts: str
    everyone: bool  # counts every user's jobs (a QOS's GrpSubmitJobs), else the user's
    qos: str = ""  # counts the jobs of this QOS ("" any)
    account: str = ""  # counts the jobs under this account ("" any)

    def limit(self, me: str, jobs: list[_Queued]) -> Limit:
        counted = sum(
            1
            for j in jobs
            if _active(j)
            and (self.everyone or j.user == me)
            and (not self.qos or j.qos == self.qos)
            and (not self.account or j.account == self.account)
        )
        return Limit(self.name, self.where, self.value, counted, self.counts)


def read(conf: Mapping[str, str] | None, qos: str = "", account: str = "", enough: int = 0) -> QueueRoom | None:
    """The room Slurm leaves this user for jobs of this QOS and account ("" = the user's defaults), by
    its configuration `conf` (`scontrol show config`); None when there is none (no Slurm here). `enough`: the caller needs to know
    only whether that many more jobs fit; when the user's own submit limits leave less room, every
    user's jobs are not asked (the answer holds those limits alone, and MaxJobCount is left out)."""
    if conf is None:
        return None
    me = user() or ""
    rules: list[_Rule] = []
    unread: list[str] = []
    enforce = conf.get("AccountingStorageEnforce", "").lower()
    if "slurmdbd" in conf.get("AccountingStorageType", "") and any(w in enforce for w in _ENFORCED):
        rules, why = _submit_rules(me, qos, account, conf.get("ClusterName", ""))
        unread += [why] if why else []
    own = [rule for rule in rules if not rule.everyone]
    if enough > 0 and own and me:
        mine = _jobs(me)
        if mine is not None:
            limits = tuple(rule.limit(me, mine) for rule in own)
            if min(limit.room for limit in limits) < enough:
                return QueueRoom(limits, sum(1 for j in mine if j.user == me and _active(j)), tuple(unread))
    jobs = _jobs()
    if jobs is None:
        return QueueRoom((), 0, ("squeue did not answer: jobs queued now unknown",))
    max_jobs = _int(conf.get("MaxJobCount")) or DEFAULT_MAX_JOB_COUNT
    age = conf.get("MinJobAge", "")
    count = Limit(
        "MaxJobCount",
        "slurm.conf",
        max_jobs,
        len(jobs),
        f"held by the controller (every user's, ended ones until MinJobAge = {age or '?'} passes)",
        held_back=1,
    )
    limits = (count, *(rule.limit(me, jobs) for rule in rules))
    return QueueRoom(limits, sum(1 for j in jobs if j.user == me and _active(j)), tuple(unread))


def _submit_rules(me: str, qos: str, account: str, cluster: str) -> tuple[list[_Rule], str]:
    """The association's and QOS's submit limits for this user (sacctmgr); with them, what could not be read."""
    where = [f"user={me}"] + ([f"cluster={cluster}"] if cluster else [])
    fields = "format=Account,Partition,MaxSubmit,GrpSubmit,DefaultQOS"
    assoc = slurm.ask(["sacctmgr", "-n", "-P", "show", "assoc", "where", *where, fields])
    if assoc is None:
        return [], "sacctmgr did not answer: the association's and QOS's MaxSubmitJobs unknown"
    rows = [line.split("|") for line in assoc.splitlines() if line.count("|") == 4]
    if not account:
        said = slurm.ask(["sacctmgr", "-n", "-P", "show", "user", me, "format=DefaultAccount"]) or ""
        account = said.strip().splitlines()[0] if said.strip() else (rows[0][0] if rows else "")
    rules = []
    row = next((r for r in rows if r[0] == account and not r[1]), None) or next(
        (r for r in rows if r[0] == account), None
    )
    if row is not None:
        for name, text in (("MaxSubmitJobs", row[2]), ("GrpSubmitJobs", row[3])):
            value = _int(text)
            if value is not None:
                where_ = f"association {account}/{me}"
                rules.append(_Rule(name, where_, value, f"of yours queued under account {account}", False, "", account))
    qos = qos or (row[4] if row is not None and row[4] else "normal")
    answer = slurm.ask(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=Name,MaxSubmitPU,GrpSubmit"])
    if answer is None:
        return rules, f"sacctmgr did not answer about QOS {qos}: its MaxSubmitJobs unknown"
    for line in answer.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or parts[0] != qos:
            continue
        per_user, group = _int(parts[1]), _int(parts[2])
        if per_user is not None:
            rules.append(
                _Rule("MaxSubmitJobsPerUser", f"QOS {qos}", per_user, f"of yours queued in QOS {qos}", False, qos)
            )
        if group is not None:
            rules.append(_Rule("GrpSubmitJobs", f"QOS {qos}", group, f"queued in QOS {qos} (every user's)", True, qos))
    return rules, ""


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def script_options(script: Path) -> tuple[str, str]:
    """The QOS and account a batch script asks for in its #SBATCH lines ("" where it names none)."""
    try:
        text = script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", ""
    qos = re.findall(r"^#SBATCH\s+--qos[= ](\S+)", text, re.MULTILINE)
    account = re.findall(r"^#SBATCH\s+--account[= ](\S+)", text, re.MULTILINE)
    return (qos[-1] if qos else ""), (account[-1] if account else "")


def refusal(said: str, what: str, qos: str = "", account: str = "") -> str | None:
    """The one-line cause of a refusal for a queue limit (sbatch's words `said`, for a job of this QOS and
    account), naming the limit, its value, how many jobs it counts, and what to do; None when the words
    are about something else."""
    busy = BUSY in said
    if not busy and POLICY not in said:
        return None
    room = read(slurm.show_config(), qos, account)
    todo = (
        "submit the rest later with `jobgen submit --resume RUN`, set launch.max_queued to submit in waves, "
        "or sweep fewer points"
    )
    if busy:
        count = next((lim for lim in room.limits if lim.name == "MaxJobCount"), None) if room else None
        held = f" ({count.describe()})" if count else ""
        mine = f"; you have {room.queued} queued" if room else ""
        return (
            f"{what}: the controller holds as many jobs as slurm.conf's MaxJobCount lets it{held}{mine}; "
            f"it takes more once jobs end (and MinJobAge passes): {todo}"
        )
    full = [lim for lim in room.limits if lim.room == 0 and lim.name != "MaxJobCount"] if room else []
    if full:
        return f"{what}: refused by {full[0].describe()}; you have {room.queued if room else '?'} queued: {todo}"
    counting = [lim for lim in room.limits if lim.name != "MaxJobCount"] if room else []
    if counting:
        # None is full now, but jobs that end between sbatch's refusal and this count free their slots:
        # the tightest submit limit is the likely cause, said with the count as it is now.
        tight = min(counting, key=lambda lim: lim.room)
        return (
            f"{what}: refused by an accounting/QOS limit ({' '.join(said.split())}), probably {tight.describe()} "
            "now (jobs may have ended since sbatch asked), or the job's size or time is above the QOS's or "
            f"association's limit (sacctmgr show qos): {todo}"
        )
    return (
        f"{what}: refused by an accounting/QOS limit ({' '.join(said.split())}); "
        "the job's size or time may be above the QOS's or association's limit (sacctmgr show qos), or: "
        f"{todo}"
    )


def submit(command: list[str], what: str) -> str:
    """jobgen.backends._tools.submit, its refusal for a queue limit said as refusal() says it."""
    try:
        return slurm.submit(command, what)
    except SubmitError as exc:
        cause = refusal(exc.message, what, *script_options(Path(command[-1])))
        if cause is None:
            raise
        raise SubmitError(cause, maybe_queued=exc.maybe_queued) from None
