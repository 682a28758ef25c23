"""Where jobs stand: sacct when the cluster keeps accounting, else squeue/scontrol, else the run's files.

Clusters without accounting are common (sacct then fails): every answer here has a fallback, and a
job that Slurm has forgotten is judged by what it left in its directory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.backends import _tools as slurm
from jobgen.errors import JobgenError
from jobgen.run import store as record
from jobgen.run.damage import read_json
from jobgen.states import State, from_slurm, parse

SACCT_FIELDS = "JobID,State,ExitCode,Elapsed,NNodes,NodeList,Submit,Start,End"


@dataclass
class JobInfo:
    """What Slurm (or the files) say about one job."""

    state: State
    elapsed: str = ""
    nodes: str = ""
    nodelist: str = ""
    exit_code: str = ""
    start: str = ""
    end: str = ""
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def query(job_ids: list[str]) -> dict[str, JobInfo]:
    """Info for each job id Slurm knows: sacct first, squeue + scontrol for what it lacks."""
    ids = [j for j in job_ids if j]
    if not ids:
        return {}
    found = _sacct(ids)
    missing = [j for j in ids if j not in found]
    if missing:
        found.update(_squeue(missing))
    for jid in [j for j in ids if j not in found]:
        info = _scontrol(jid)
        if info:
            found[jid] = info
    return found


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
    match = re.fullmatch(r"(\d+)_\[([\d,\-]+)(?:%\d+)?\]", jid)
    if not match:
        return [jid]
    base, ids = match.group(1), []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        ids += [f"{base}_{i}" for i in range(int(low), int(high or low) + 1)]
    return ids


def _squeue(ids: list[str]) -> dict[str, JobInfo]:
    said = slurm.ask(["squeue", "-h", "-r", "-o", "%i|%T|%M|%D|%N|%S", "-j", ",".join(ids)])
    if said is None:
        # squeue refuses the whole list when one id is unknown: ask one by one.
        if len(ids) > 1:
            out: dict[str, JobInfo] = {}
            for jid in ids:
                out.update(_squeue([jid]))
            return out
        return {}
    out = {}
    for line in said.splitlines():
        parts = line.split("|")
        if len(parts) == 6:
            jid, state, elapsed, nnodes, nodelist, start = parts
            out[jid] = JobInfo(from_slurm(state), elapsed, nnodes, nodelist, "", _time(start), "", "squeue")
    return out


def _scontrol(jid: str) -> JobInfo | None:
    said = slurm.ask(["scontrol", "show", "job", "-o", jid])
    if said is None or "JobState=" not in said:
        return None
    kv = dict(re.findall(r"(\w+)=(\S*)", said))
    nodelist = kv.get("NodeList", "")
    return JobInfo(
        from_slurm(kv.get("JobState", "")), kv.get("RunTime", ""), kv.get("NumNodes", ""),
        "" if nodelist == "(null)" else nodelist, kv.get("ExitCode", ""), _time(kv.get("StartTime", "")),
        _time(kv.get("EndTime", "")), "scontrol",
    )  # fmt: skip


def _time(value: str) -> str:
    return "" if value in ("", "Unknown", "None", "N/A") else value


def from_files(run_dir: Path, job: dict[str, Any]) -> JobInfo:
    """When Slurm does not know a job: its last recorded final state, else what its directory shows."""
    last = job.get("state", "")
    if last in State._value2member_map_ and State(last).is_final:
        return JobInfo(State(last), source="manifest")
    doc, _ = read_json(run_dir / job["dir"] / "result.json")
    # Any result the job wrote (even of another schema) says it got to the end; a damaged one does not.
    return (
        JobInfo(State.COMPLETED, source="result.json")
        if isinstance(doc, dict)
        else JobInfo(State.UNKNOWN, source="manifest")
    )


def job_ids(job: dict[str, Any]) -> list[str]:
    """The Slurm ids of one manifest job: its segments when chained (slurm.chain), else its id."""
    return list(job.get("segments") or ([job["job_id"]] if job.get("job_id") else []))


def live_info(run_dir: Path, job: dict[str, Any], found: dict[str, JobInfo]) -> JobInfo | None:
    """What Slurm says about a job; a chain of segments is one logical job."""
    if not job.get("segments"):
        return found.get(job.get("job_id") or "")
    return chain_info(job["segments"], found, (run_dir / job["dir"] / "result.json").is_file())


def chain_info(segments: list[str], found: dict[str, JobInfo], finished: bool) -> JobInfo | None:
    """One job from its segments: running while one runs, pending while one waits, completed once the
    training wrote its result (later segments then stop at once); else how the last one that ran ended."""
    infos = [found.get(jid) for jid in segments]
    if not any(infos):
        return None
    states = [i.state.value if i else "?" for i in infos]
    ran = [n for n, i in enumerate(infos) if i and i.start and i.state is not State.PENDING]
    current = next((n for n, i in enumerate(infos) if i and i.state is State.RUNNING), ran[-1] if ran else 0)
    base = infos[current] or next(i for i in infos if i)
    if finished:
        state = State.COMPLETED
    elif any(i and i.state is State.RUNNING for i in infos):
        state = State.RUNNING
    elif any(i and not i.state.is_final for i in infos):
        state = State.PENDING
    else:
        state = base.state
    extra = {"segments": states, "segment": current + 1}
    return JobInfo(
        state,
        _total_elapsed([i.elapsed for i in infos if i]),
        base.nodes,
        base.nodelist,
        base.exit_code,
        infos[0].start if infos[0] else "",
        base.end if state.is_final else "",
        base.source,
        extra,
    )


def _total_elapsed(values: list[str]) -> str:
    """Slurm's elapsed times ([D-]HH:MM:SS, MM:SS) added up, in the same form."""
    total = 0
    for value in values:
        days, _, clock = value.rpartition("-")
        parts = [int(p) for p in clock.split(":") if p.isdigit()]
        if not parts:
            continue
        seconds = sum(p * 60**i for i, p in enumerate(reversed(parts)))
        total += seconds + int(days or 0) * 86400
    whole_days, rest = divmod(total, 86400)
    shown = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{whole_days}-{shown}" if whole_days else shown


def run_status(run_dir: Path) -> tuple[dict[str, Any], list[tuple[dict[str, Any], JobInfo]]]:
    """The manifest and, per job, its current info; the manifest's last-known states are refreshed."""
    manifest = record.load_manifest(run_dir)
    jobs = manifest["jobs"]
    live = backends.get(manifest["backend"]).states([i for j in jobs for i in job_ids(j)])
    rows, updates = [], {}
    for job in jobs:
        info = live_info(run_dir, job, live) or from_files(run_dir, job)
        rows.append((job, info))
        fields = {"state": info.state.value}
        if info.start:
            fields["started_at"] = info.start
        if info.end:
            fields["ended_at"] = info.end
        if any(job.get(k) != v for k, v in fields.items()):
            updates[job["name"]] = fields
    if updates:
        ids = {job["name"]: job.get("job_id") for job in jobs}
        manifest = record.update_jobs(run_dir, updates, if_job_id=ids)
    return manifest, rows


def status_table(run_dir: Path) -> tuple[list[str], list[list[str]], bool]:
    """(header, rows, all_final) for `jobgen status`."""
    _, rows = run_status(run_dir)
    header = ["job", "sweep", "job id", "state", "elapsed", "nodes", "exit", "progress", "source"]
    table = []
    for job, info in rows:
        sweep = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in job.get("sweep", {}).items())
        where = progress(run_dir / job["dir"], info.state)
        if "segments" in info.extra:  # a chain: which segment, and how each one went
            where = (
                f"segment {info.extra['segment']}/{len(info.extra['segments'])} "
                f"({' '.join(info.extra['segments'])}): {where}"
            )
        table.append([job["name"], sweep, ",".join(job_ids(job)) or "-", info.state.value, info.elapsed or "-",
                      info.nodelist or info.nodes or "-", info.exit_code or "-", where, info.source])  # fmt: skip
    return header, table, all(info.state.is_final for _, info in rows)


def runs_table(run_dirs: list[Path], root: Path, refresh: bool) -> tuple[list[str], list[list[str]]]:
    """(header, rows) for `jobgen runs`: one row per run with its jobs' states counted; `refresh` asks
    Slurm about runs whose manifest still has jobs not known to have ended."""
    from collections import Counter
    from datetime import datetime

    rows = []
    for run_dir in run_dirs:
        name = str(run_dir.relative_to(root)) if run_dir.is_relative_to(root) else str(run_dir)
        try:
            manifest = record.load_manifest(run_dir)
        except JobgenError as exc:  # one damaged run must not hide the others
            rows.append([name, "-", "-", "-", f"damaged manifest.json: {exc.message.split(': damaged: ')[-1]}"])
            continue
        if refresh and not all(parse(j["state"]).is_final for j in manifest["jobs"]):
            manifest, _ = run_status(run_dir)
        counts = Counter(j["state"] for j in manifest["jobs"])
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        try:
            created = datetime.fromisoformat(manifest.get("created") or "").astimezone().strftime("%Y-%m-%d %H:%M:%S")
        except (ValueError, TypeError):
            created = "-"
        rows.append([name, created, manifest["backend"], str(len(manifest["jobs"])), states])
    return ["run", "created", "backend", "jobs", "states" if refresh else "states (last known)"], rows


def progress(job_dir: Path, state: State) -> str:
    """'epoch 2/3 45%' from the job's progress.json (written by the training as it goes); '-' if none."""
    if state is State.COMPLETED:
        return "done"
    try:
        doc = json.loads((job_dir / "progress.json").read_text(encoding="utf-8"))
        epoch, epochs, batch, batches = (int(doc[k]) for k in ("epoch", "epochs", "batch", "batches"))
    except (OSError, ValueError, KeyError, TypeError):
        return "-"
    return f"epoch {epoch + 1}/{epochs} {100 * batch // max(batches, 1)}%"


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)
