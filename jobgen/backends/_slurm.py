"""What every scheduler that hands jobs to Slurm shares: states, cancel, requeue, signals, finding jobs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobgen.backends import _queue
from jobgen.backends import _tools as slurm
from jobgen.backends._base import Attempt, Scheduler
from jobgen.backends._queue import QueueRoom
from jobgen.errors import SubmitError
from jobgen.facts import JobShape, submit_tag
from jobgen.states import Answer, JobInfo, from_slurm

DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default; `scontrol show config` tells the real one


class SlurmScheduler(Scheduler):
    logs = {"out": ("slurm-*.out",), "err": ("slurm-*.err",)}

    def states(self, job_ids: list[str]) -> dict[str, JobInfo]:
        return query(job_ids)

    def usage(self, job_ids: list[str]) -> dict[str, list[Attempt]]:
        return usage(job_ids)

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            slurm.run(["scancel", *job_ids], what="cancelling")

    def requeue_refusal(self, run_dir: Path) -> str | None:
        return None

    def requeue(self, job_id: str, what: str) -> None:
        slurm.run(["scontrol", "requeue", job_id], what=what)

    def signal(self, job_id: str, signal: str, what: str) -> None:
        slurm.run(["scancel", f"--signal={signal}", job_id], what=what)

    def find(self, run_dir: Path, entries: list[dict[str, Any]], since: str) -> dict[str, list[str]]:
        """Job ids Slurm holds for each entry (by name), found by the tag in its --comment (squeue, for the
        jobs the controller remembers) or by its script in the submit line (sacct, with accounting).
        Array tasks come as "<array id>_<task>". Raises SubmitError when Slurm answers neither way."""
        tags = {submit_tag(run_dir.name, e["name"]): e["name"] for e in entries}
        scripts = {str(run_dir / e["script"]): e["name"] for e in entries}
        found: dict[str, list[str]] = {}

        def add(name: str | None, job_id: str) -> None:
            if name and job_id not in found.setdefault(name, []):
                found[name].append(job_id)

        queue = slurm.ask(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%k"])
        for line in queue.splitlines() if queue is not None else []:
            job_id, _, comment = line.partition("|")
            add(tags.get(comment.split(" ", 1)[0]), job_id.strip())
        start = dt.datetime.fromisoformat(since).astimezone() - dt.timedelta(hours=1)
        acct = slurm.ask(
            ["sacct", "-n", "-P", "-X", "--format=JobID,Comment,SubmitLine", "-S", start.strftime("%Y-%m-%dT%H:%M:%S")]
        )
        for line in acct.splitlines() if acct is not None else []:
            job_id, _, rest = line.partition("|")
            comment, _, submit_line = rest.partition("|")
            script = next((path for path in scripts if submit_line.endswith(path)), None)
            add(tags.get(comment.split(" ", 1)[0]) or scripts.get(script or ""), job_id.strip())
        if queue is None and acct is None:
            raise SubmitError(
                "cannot tell which jobs Slurm already holds (squeue and sacct did not answer); "
                "nothing was submitted again: run the command again once Slurm answers"
            )
        return found

    def settings(self) -> dict[str, str] | None:
        return slurm.show_config()

    def max_array_size(self, settings: Mapping[str, str] | None) -> int:
        """The cluster's MaxArraySize (task ids must be below it), or Slurm's default if unknown."""
        value = (settings or {}).get("MaxArraySize", "")
        return int(value) if value.isdigit() else DEFAULT_MAX_ARRAY_SIZE

    def queue_room(
        self, settings: Mapping[str, str] | None, qos: str = "", account: str = "", enough: int = 0
    ) -> QueueRoom | None:
        return _queue.read(settings, qos, account, enough)

    def max_time(self, partition: str) -> int | None:
        """The partition's MaxTime (`scontrol show partition`; "" = the one marked Default=YES)."""
        out = slurm.run(["scontrol", "show", "partition", "-o", *([partition] if partition else [])], what="asking")
        return partition_max_time(out, partition)

    def shape_problems(self, shape: JobShape) -> list[str]:
        if shape.accelerator == "gpu" and not shape.gpus_per_node:
            return ["train.accelerator = 'gpu' but slurm.gpus_per_node = 0: ask for GPUs or use accelerator 'auto'"]
        return []


# --- the experiment's resources in Slurm's words: the one mapping sbatch scripts and submitit read ------

Option = tuple[str, str | None]  # an sbatch long option and its value; None marks a bare flag


def resource_options(s: Mapping[str, Any]) -> list[Option]:
    """The resources a job asks for, from its `[slurm]` values (the experiment's, or spec.json's), in the
    order the scripts list them. A new `[slurm]` resource key is one line here (and its schema field)."""
    opts: list[Option] = [
        ("nodes", str(s["nodes"])),
        ("ntasks-per-node", str(s["ntasks_per_node"])),
        ("cpus-per-task", str(s["cpus_per_task"])),
    ]
    if s["gpus_per_node"]:
        gpus = s["gpus_per_node"]
        opts.append(("gpus-per-node", f"{s['gpu_type']}:{gpus}" if s["gpu_type"] else str(gpus)))
    if s["mem"]:
        opts.append(("mem", s["mem"].upper()))
    if s["time"]:  # empty: the partition's default (a probe of a job whose time is "auto")
        opts.append(("time", s["time"]))
    opts += [(flag, s[flag]) for flag in ("partition", "account", "qos", "constraint") if s[flag]]
    if s["exclusive"]:
        opts.append(("exclusive", None))
    return opts


def extra_options(extra: Mapping[str, Any]) -> list[Option]:
    """`slurm.extra`, sorted: true is a bare flag, false leaves the flag out."""
    return [
        (flag, None if value is True else str(value)) for flag, value in sorted(extra.items()) if value is not False
    ]


# sbatch options that ask for a resource resource_options() already asks for under another name: beside
# it they ask twice (GPUs by --gres and by --gpus-per-node) or Slurm refuses the pair (--mem with
# --mem-per-cpu). Each maps to the option of resource_options() it duplicates.
SAME_RESOURCE: dict[str, str] = {
    "gres": "gpus-per-node",  # only when it names gpus: --gres=nvme:1 asks for something else
    "gpus": "gpus-per-node",
    "gpus-per-task": "gpus-per-node",
    "gpus-per-socket": "gpus-per-node",
    "mem-per-cpu": "mem",
    "mem-per-gpu": "mem",
    "cpus-per-gpu": "cpus-per-task",
    "ntasks": "ntasks-per-node",
}


def extra_clashes(s: Mapping[str, Any], extra: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(extra flag, option of resource_options(s) it duplicates) for every `slurm.extra` flag that asks
    for what the `[slurm]` values `s` already ask for, by its own name or another (SAME_RESOURCE)."""
    written = {flag for flag, _ in resource_options(s)}
    clashes = []
    for flag, value in extra_options(extra):
        if flag == "gres" and "gpu" not in (value or "").lower():
            continue
        target = flag if flag in written else SAME_RESOURCE.get(flag)
        if target in written:
            clashes.append((flag, target))
    return clashes


# --- asking Slurm where jobs stand ---------------------------------------------------------------------

SACCT_FIELDS = "JobID,State,ExitCode,Elapsed,NNodes,NodeList,Submit,Start,End"


# Below Linux's 128 KiB cap on one argument (MAX_ARG_STRLEN): sacct answers few long calls faster than many short.
SACCT_ARG_BYTES = 120_000


def sacct_chunks(ids: list[str]) -> list[list[str]]:
    """The ids in runs whose comma-joined text fits in SACCT_ARG_BYTES, in order."""
    chunks: list[list[str]] = []
    size = SACCT_ARG_BYTES + 1
    for jid in ids:
        if size + 1 + len(jid) > SACCT_ARG_BYTES:
            chunks.append([])
            size = -1
        chunks[-1].append(jid)
        size += 1 + len(jid)
    return chunks


def query(job_ids: list[str]) -> Answer:
    """Info for each job id Slurm knows: squeue first (the controller's word, current for every job it
    still holds, ended ones included), sacct for the jobs the controller has forgotten, and scontrol for
    the ended jobs neither gave an exit code. When neither squeue nor scontrol answered (a controller
    down or too busy), the answer says so (Answer.silent): its silence about a job is no news of it.

    One process per tool for the whole list (sacct in chunks), never one per job (submitit#1759): a
    sweep the controller still holds, queued, running or just ended, costs one squeue.
    """
    ids = list(dict.fromkeys(j for j in job_ids if j))
    if not ids:
        return Answer()
    wanted = set(ids)
    # The accounting database is written after the controller, and lags it under load: sacct can call a
    # job pending or running that has ended. So the controller is asked first, and its word stands for
    # every job it holds; the accounting answers for the rest (MinJobAge after they ended).
    queue, silent = _squeue(wanted)
    found = {jid: info for jid, info in queue.items() if jid in wanted}
    forgotten = [jid for jid in ids if jid not in found]
    if forgotten:
        asked = sacct_ids(forgotten)
        from_acct: dict[str, JobInfo] = {}
        for chunk in sacct_chunks(asked):
            from_acct |= _sacct(chunk)
        found |= {jid: from_acct[jid] for jid in forgotten if jid in from_acct}
    # An ended job without an exit code (a squeue that does not print it; no accounting): scontrol.
    missing = wanted - {jid for jid, info in found.items() if info.exit_code or not info.state.is_final}
    if missing:
        held, scontrol_silent = _scontrol(missing)
        found |= held
        if not scontrol_silent:
            silent = ""  # the controller answered after all: a job it does not hold has left it
    answer = Answer({jid: found[jid] for jid in ids if jid in found})
    # Neither squeue nor scontrol answered: a job missing from the answer may still be queued or
    # running (a result.json in its folder may be an earlier attempt's), so it is not judged by its files.
    answer.silent = silent
    return answer


def sacct_ids(ids: list[str]) -> list[str]:
    """The ids to hand sacct for these jobs: the tasks of an array (<array id>_<task>) as the array's id,
    which sacct answers with a line per task: a sweep of arrays is a short list, not chunks of task ids.
    The tasks not asked about are left out of the answer."""
    return list(dict.fromkeys(jid.split("_", 1)[0] for jid in ids))


def _sacct(ids: list[str]) -> dict[str, JobInfo]:
    said = slurm.ask(["sacct", "-n", "-P", "-X", f"--format={SACCT_FIELDS}", "-j", ",".join(ids)])
    if said is None:
        return {}  # accounting disabled or unreachable: the callers fall back
    out: dict[str, JobInfo] = {}
    for line in said.splitlines():
        parts = line.split("|")
        if len(parts) != 9:
            continue
        jid, state, exit_code, elapsed, nnodes, nodelist, _submit, start, end = parts
        info = JobInfo(from_slurm(state), elapsed, nnodes, nodelist, exit_code, _time(start), _time(end), "sacct")
        for one in expand_array_id(jid):
            out[one] = info
    return out


def expand_array_id(jid: str) -> list[str]:
    """'7_[0-2,5%2]' (a pending array, as sacct shows it) -> ['7_0', '7_1', '7_2', '7_5']."""
    if "[" not in jid and "-" not in jid and "," not in jid and "%" not in jid:
        return [jid]  # one job or task (most lines of squeue -r and sacct): no pattern to match
    match = re.fullmatch(r"(\d+)_\[?([\d,\-]+)(?:%\d+)?\]?", jid)
    if not match:
        return [jid]
    base, ids = match.group(1), []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        ids += [f"{base}_{i}" for i in range(int(low), int(high or low) + 1)]
    return ids


# --- what jobs were allocated and used: summary and report ask, status never does ----------------------

# -D: every attempt of a requeued job, each with its own allocation, elapsed time and limit (users pay
# for all of them). AllocTRES is the job's whole allocation: "billing=8,cpu=8,gres/gpu=4,mem=64G,node=1".
# State says whether an attempt's numbers are final (the accounting lags the controller).
USAGE_FIELDS = "JobID,Start,ElapsedRaw,TimelimitRaw,AllocTRES,ConsumedEnergyRaw,State"
NO_VAL64 = 2**63  # sacct prints Slurm's "no value" markers (0xfffffffffffffffe) as huge numbers


def usage(job_ids: list[str]) -> dict[str, list[Attempt]]:
    """Every attempt of each job id that the accounting database knows: one sacct per SACCT_ARG_BYTES of ids.
    {} without accounting (sacct refuses, or is missing: a copied run read elsewhere)."""
    ids = list(dict.fromkeys(j for j in job_ids if j))
    out: dict[str, list[Attempt]] = {}
    requeued: list[tuple[str, str, int]] = []  # (job id, start, index in out[id]) of each REQUEUED attempt
    for chunk in sacct_chunks(sacct_ids(ids)):
        said = slurm.ask(_usage_command(chunk))
        for line in said.splitlines() if said is not None else []:
            parsed = parse_usage_line(line)
            if parsed is None:
                continue
            fields = line.split("|")  # parse_usage_line checked its shape: USAGE_FIELDS
            for one in expand_array_id(parsed[0]):
                out.setdefault(one, []).append(parsed[1])
                if fields[6].strip() == "REQUEUED" and parsed[1].started:
                    requeued.append((one, fields[1].strip(), len(out[one]) - 1))
    wanted = set(ids)
    if requeued:
        _end_with_the_batch_step(out, [r for r in requeued if r[0] in wanted])
    return {jid: found for jid, found in out.items() if jid in wanted}


def _end_with_the_batch_step(out: dict[str, list[Attempt]], requeued: list[tuple[str, str, int]]) -> None:
    """An attempt requeued after it had ended (a halving promotion, `jobgen requeue` of an ended job) is
    recorded as held until the requeue, minutes or hours later; its batch step keeps when it ended. Each
    REQUEUED attempt's time is its batch step's, where that is shorter: one more sacct, for those jobs."""
    steps: dict[tuple[str, str], int] = {}
    for chunk in sacct_chunks(sacct_ids([jid for jid, _, _ in requeued])):
        said = slurm.ask(["sacct", "-n", "-P", "-D", "--format=JobID,Start,ElapsedRaw", "-j", ",".join(chunk)])
        for line in said.splitlines() if said is not None else []:
            parts = [p.strip() for p in line.split("|")]
            if len(parts) == 3 and parts[0].endswith(".batch") and parts[2].isdigit():
                steps[parts[0].removesuffix(".batch"), parts[1]] = int(parts[2])
    for jid, start, at in requeued:
        ended = steps.get((jid, start))
        if ended is not None and ended < out[jid][at].elapsed_s:
            out[jid][at] = dataclasses.replace(out[jid][at], elapsed_s=ended)


def _usage_command(chunk: list[str]) -> list[str]:
    return ["sacct", "-n", "-P", "-X", "-D", f"--format={USAGE_FIELDS}", "-j", ",".join(chunk)]


def parse_usage_line(line: str) -> tuple[str, Attempt] | None:
    """One line of the USAGE_FIELDS query -> (job id, attempt); None for a line of another shape."""
    parts = line.split("|")
    if len(parts) != 7 or not parts[2].strip().isdigit():
        return None
    jid, start, elapsed, limit, tres, energy, state = (p.strip() for p in parts)
    counts = parse_tres(tres)
    return jid, Attempt(
        # A job cancelled in the queue has a Start (its end) but no allocation.
        started=_time(start) != "" and bool(tres),
        elapsed_s=int(elapsed),
        limit_s=int(limit) * 60 if limit.isdigit() else None,  # TimelimitRaw is in minutes
        cpus=counts.get("cpu"),
        gpus=tres_gpus(counts),
        energy_j=int(energy) if energy.isdigit() and 0 < int(energy) < NO_VAL64 else None,
        final=from_slurm(state).is_final,
    )


def parse_tres(text: str) -> dict[str, int]:
    """'billing=8,cpu=8,gres/gpu=4,mem=64G,node=1' -> the whole counts {billing: 8, cpu: 8, gres/gpu: 4,
    node: 1}; sizes (mem=64G) and anything unreadable are left out."""
    counts = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name and value.isdigit():
            counts[name.strip()] = int(value)
    return counts


def tres_gpus(counts: dict[str, int]) -> int | None:
    """GPUs in an allocation: gres/gpu, which Slurm adds up over the types; only the typed counts
    (gres/gpu:a100=4) when it is absent. None when it lists neither: a cluster whose accounting does not
    track GPUs (AccountingStorageTRES without gres/gpu) leaves them out of every job, GPU jobs too."""
    if "gres/gpu" in counts:
        return counts["gres/gpu"]
    typed = [n for name, n in counts.items() if name.startswith("gres/gpu:")]
    return sum(typed) if typed else None


# What squeue prints of each job (-O: every field, each ended by "|"): exit_code is the job's raw wait
# status, as the controller keeps it, and EndTime is the expected end while the job runs.
SQUEUE_FIELDS = ("JobArrayID", "State", "TimeUsed", "NumNodes", "NodeList", "StartTime", "EndTime", "exit_code")


def _squeue_command() -> list[str]:
    fmt = ",".join(f"{field}:|" for field in SQUEUE_FIELDS)
    return ["squeue", "-h", "-r", "-t", "all", *_own_jobs(), "-O", fmt]


def _squeue(wanted: set[str] | None = None) -> tuple[dict[str, JobInfo], str]:
    """Every job the controller still holds, ended ones included (-t all), array tasks one per line (-r);
    with `wanted`, only the lines that name one of those ids are read further (the user's other jobs,
    tens of thousands within MinJobAge after a few sweeps, cost a split and a lookup each).

    Not `-j <ids>`: squeue refuses the whole list when one id is unknown to it. This user's jobs only
    (`-u`): a cluster's controller holds every user's, tens of thousands on a busy one, and a run's jobs
    are its submitter's (another user's run goes on to sacct and scontrol, as forgotten jobs do; sacct
    shows a non-root user only their own jobs, so scontrol answers it). With the jobs: why squeue gave
    no answer ("" when it did, or is missing: no Slurm here)."""
    said, why = slurm.ask_why(_squeue_command())
    out: dict[str, JobInfo] = {}
    for line in said.splitlines() if said is not None else []:
        named, _, rest = line.partition("|")
        jid = named.strip()
        if wanted is not None and jid not in wanted and not any(one in wanted for one in expand_array_id(jid)):
            continue
        info = _squeue_info(rest)
        if info is not None:
            for one in expand_array_id(jid):
                out[one] = info
    return out, why


def _squeue_info(rest: str) -> JobInfo | None:
    """A squeue line's fields after the id (each ended by "|"); None for a line of another shape."""
    parts = rest.split("|")
    if len(parts) != len(SQUEUE_FIELDS):
        return None
    state_text, elapsed, nnodes, nodelist, start, end, status = (p.strip() for p in parts[:-1])
    state = from_slurm(state_text)
    final = state.is_final
    return JobInfo(
        state,
        sacct_elapsed(elapsed),
        nnodes,
        nodelist,
        exit_code(status) if final else "",
        _time(start),
        _time(end) if final else "",  # a running job's EndTime is its time limit's
        "squeue",
    )


def _own_jobs() -> list[str]:
    """squeue's filter for the jobs of the user running jobgen; none when the system cannot name them."""
    me = _queue.user()
    return ["-u", me] if me else []


NO_VAL = 0xFFFFFFFE  # Slurm's "no value" for a 32-bit field


def exit_code(status: str) -> str:
    """A raw wait status, as squeue prints it, in sacct's words: "<exit status>:<signal>", the status
    less 128 when the shell reported a signal as 128 + n, as sacct does (256 -> "1:0", 9 -> "0:9",
    36608 (exit 143) -> "15:0"); "" when it is no number (or Slurm's no-value marker)."""
    if not status.isdigit() or int(status) >= NO_VAL:
        return ""
    raw = int(status)
    return _as_sacct((raw >> 8) & 0xFF, raw & 0x7F)


def _as_sacct(status: int, signal: int) -> str:
    return f"{status - 128 if status >= 128 else status}:{signal}"


def _scontrol_exit(text: str) -> str:
    """scontrol's ExitCode ("143:0") in sacct's words ("15:0"); anything else as it came."""
    status, _, signal = text.partition(":")
    return _as_sacct(int(status), int(signal)) if status.isdigit() and signal.isdigit() else text


def sacct_elapsed(text: str) -> str:
    """squeue's elapsed time ("1:06", "2:03:04", "1-02:03:04") as sacct writes it ("00:01:06",
    "02:03:04", "1-02:03:04"), so one table shows one format whichever tool answered; "" when unreadable."""
    seconds = _duration(text)
    if seconds is None:
        return ""
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


_SCONTROL_IDS = re.compile(r"JobId=(\S*)(?:.*? ArrayJobId=(\S*) ArrayTaskId=(\S*))?")


def _scontrol(wanted: set[str]) -> tuple[dict[str, JobInfo], str]:
    """The `wanted` jobs among those `scontrol show job` knows, one line each (-o); array tasks by <array
    id>_<task>. It lists every job the controller holds: only the lines of wanted jobs are read whole.
    With them: why scontrol gave no answer ("" when it did, or is missing)."""
    said, why = slurm.ask_why(["scontrol", "show", "job", "-o"])
    out: dict[str, JobInfo] = {}
    for line in said.splitlines() if said is not None else []:
        ids = _SCONTROL_IDS.match(line)
        if "JobState=" not in line or ids is None:
            continue
        jid, array, task = ids.groups()
        if jid not in wanted and not (array and any(one in wanted for one in expand_array_id(f"{array}_{task}"))):
            continue
        kv = dict(re.findall(r"(\w+)=(\S*)", line))
        nodelist = kv.get("NodeList", "")
        info = JobInfo(
            from_slurm(kv.get("JobState", "")),
            kv.get("RunTime", ""),
            kv.get("NumNodes", ""),
            "" if nodelist == "(null)" else nodelist,
            _scontrol_exit(kv.get("ExitCode", "")),
            _time(kv.get("StartTime", "")),
            _time(kv.get("EndTime", "")),
            "scontrol",
        )
        out[kv.get("JobId", "")] = info
        if kv.get("ArrayJobId") and kv.get("ArrayTaskId"):
            for one in expand_array_id(f"{kv['ArrayJobId']}_{kv['ArrayTaskId']}"):
                out[one] = info
    return {jid: info for jid, info in out.items() if jid in wanted}, why


def _time(value: str) -> str:
    return "" if value in ("", "Unknown", "None", "N/A") else value


def partition_max_time(out: str, partition: str) -> int | None:
    """MaxTime in seconds from `scontrol show partition -o` lines (one per partition): the named one,
    else the default one; None for UNLIMITED. An error names the partition when it is not there."""
    parts = [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in out.splitlines() if line.strip()]
    chosen = [p for p in parts if (p.get("PartitionName") == partition if partition else p.get("Default") == "YES")]
    if not chosen:
        known = ", ".join(p.get("PartitionName", "?") for p in parts) or "none"
        what = f"partition {partition!r}" if partition else "a default partition"
        raise SubmitError(f"slurm.partition: Slurm has no {what} (partitions: {known})")
    return _duration(chosen[0].get("MaxTime", "UNLIMITED"))


def _duration(text: str) -> int | None:
    """A time as scontrol prints it ([D-]HH:MM:SS, MM:SS) in seconds; None for UNLIMITED or junk."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        return None
    days, *clock = match.groups()
    parts = [int(p) for p in clock if p is not None]
    if days is not None:  # D-H, D-H:M, D-H:M:S
        hours, minutes, secs = (parts + [0, 0])[:3]
    else:  # M, M:S, H:M:S (sbatch's reading)
        hours, minutes, secs = [[0, parts[0], 0], [0, *parts], parts][len(parts) - 1]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + secs
