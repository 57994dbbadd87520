"""Judging a product run against a case's ``expect`` block, and the report a failing test shows.

Keys: shared/cases/README.md and EFFECTS.md ("Expect keys"). Beyond them the harness holds the
product to the interface every case shares: the final status.json conforms to
docs/status.schema.json; a ``check`` run (every world has one) changes nothing (contract
section 5: no effect applied by its tool calls, no file under the root created, changed or
removed), holds no row whose detail says the check itself failed (it raised), and its rows
make a table no wider than 80 and 100 columns (the product's renderer); after a
boot no other spec in ``/var/run/cdi`` defines kind ``nvidia.com/gpu`` (section 3, step 9).
No run opens a GPU between the first ``modprobe nvidia`` and persistenced's readiness
(the ordering rule, issue 46: :mod:`scenarios.order`). A fake tool that could not apply an effect fails the test too.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import stat
from pathlib import Path

import yaml
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7
from schemas import STATUS_SCHEMA
from schemas import problems as schema_problems

from . import order
from .fake_tool import argv_matches
from .world import CDI_PATH, DATA, Call, Run, World

KIND = "nvidia.com/gpu"
UNAVAILABLE_CDI_VERSION = "0.5.0"  # contract section 2
REQUIRED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")  # section 8


@functools.cache
def cdi_schema() -> Draft7Validator:
    """The official CDI JSON schema (tests/data/cdi-schema, loaded as its README says)."""
    folder = DATA / "cdi-schema"
    schema, defs = (json.loads((folder / name).read_text()) for name in ("schema.json", "defs.json"))
    registry = Registry().with_resources([
        ("file:///schema.json", Resource.from_contents(schema, DRAFT7)),
        ("file:///defs.json", Resource.from_contents(defs, DRAFT7)),
    ])
    return Draft7Validator({"$ref": "file:///schema.json"}, registry=registry)


def judge_boot(world: World, run: Run, expect: dict) -> list[str]:
    """Problems of a boot (or rerun) against ``expect.boot`` (``expect.rerun``); empty when it passes."""
    problems = _common(run, expect)
    if run.rc is not None and not _is_json(run.stdout):
        problems.append("boot --json did not print one JSON document on stdout")
    status = run.status or {}
    if run.status is None:
        problems.append(run.status_error)
    else:
        problems += _status_problems(status, expect)
        problems += [f"status.json breaks docs/{STATUS_SCHEMA}: {p}"
                     for p in schema_problems(status, STATUS_SCHEMA)]
    if "max_wall_s" in expect and run.wall_s > expect["max_wall_s"]:
        problems.append(f"took {run.wall_s:.2f} s, more than max_wall_s {expect['max_wall_s']}")
    for entry in expect.get("not_called") or []:
        pattern = [entry] if isinstance(entry, str) else [str(arg) for arg in entry]
        hits = [shlex.join(call.argv) for call in run.calls if argv_matches(pattern, call.argv)]
        if hits:
            problems.append(f"not_called {entry!r} was called: {hits}")
    for path in expect.get("absent") or []:  # issue 28: what a boot must not leave
        if os.path.lexists(world.path("/" + str(path).lstrip("/"))):
            problems.append(f"absent {path!r} is there after the run")
    for entry in expect.get("called") or []:
        pattern = [entry] if isinstance(entry, str) else [str(arg) for arg in entry]
        if not any(argv_matches(pattern, call.argv) for call in run.calls):
            problems.append(f"called {entry!r} was not called")
    if "attestation" in expect:
        problems += _attestation_problems(world, status, expect["attestation"])
    if "binding" in expect:
        problems += _binding_problems(world, status, expect["binding"])
    if "cdi" in expect:
        problems += judge_cdi(world, expect["cdi"], expect.get("state") or status.get("state"), status)
    if expect.get("cdi_devices"):
        names = _device_names(_load_spec(world.path(CDI_PATH))[0])
        missing = [str(name) for name in expect["cdi_devices"] if str(name) not in names]
        if missing:
            problems.append(f"spec lacks cdi_devices {missing} (has {sorted(names)})")
    for tool in expect.get("not_killed") or []:
        problems += _killed(run, tool)
    return problems + order.world_problems(world, run.calls)


def _binding_problems(world: World, status: dict, expect: dict) -> list[str]:
    """``binding`` (the harness's own, issue 37): status.json's ``binding`` has each scalar
    given (``state``, ``result``, ``appended``); ``events`` is the list of results of the
    podvm-gpu events in the world's /run/attestation-agent/eventlog, in order; ``extended``
    true: the world's RTMR3 (served by tests/fake_rtmr) is the replay of that log from zero,
    and not zero; false: it is still zero."""
    import hashlib

    from podvm_gpu.host import rtmr
    from podvm_gpu.steps.cc import bind

    record = status.get("binding")
    if not isinstance(record, dict):
        return [f"status.json binding {record!r}, expected {expect!r}"]
    problems = []
    log = Path(world.path(rtmr.EVENTLOG_PATH))
    records = rtmr.parse_records(log.read_bytes() if log.exists() else b"", False, "eventlog")
    for key, want in expect.items():
        if key == "events":
            said = [json.loads(r.text().split(" ", 2)[2])["result"] for r in records
                    if (r.text() or "").startswith(f"{bind.DOMAIN} {bind.OPERATION} ")]
            if said != want:
                problems.append(f"eventlog's podvm-gpu results {said}, expected {want}")
        elif key == "extended":
            value = Path(world.path(rtmr.RTMR3_PATH)).read_bytes()
            replayed = bytes(48)
            for r in records:
                replayed = hashlib.sha384(replayed + r.digest).digest()
            if want and (value != replayed or value == bytes(48)):
                problems.append(f"RTMR3 {value.hex()[:16]}... is not the log's replay "
                                f"{replayed.hex()[:16]}...")
            if not want and value != bytes(48):
                problems.append(f"RTMR3 was extended ({value.hex()[:16]}...)")
        elif record.get(key) != want:
            problems.append(f"binding {key} {record.get(key)!r}, expected {want!r}")
    return problems


def _attestation_problems(world: World, status: dict, expect: dict | None) -> list[str]:
    """``attestation`` (the harness's own, issue 26): status.json's ``attestation`` has each
    scalar given (``result``, ``code``...), ``devices`` as a count, ``reason_contains`` as
    substrings; a kept nvattest output (``runs[].output``) is JSON whose claims carry the
    record's nonce and hash to ``claims_sha256``. ``attestation: null`` expects none."""
    import hashlib

    record = status.get("attestation")
    if expect is None:
        return [] if record is None else [f"status.json attestation {record!r}, expected null"]
    if not isinstance(record, dict):
        return [f"status.json attestation {record!r}, expected {expect!r}"]
    problems = []
    for key, want in expect.items():
        if key == "devices":
            if len(record.get("devices") or []) != want:
                problems.append(f"attestation lists {len(record.get('devices') or [])} "
                                f"devices, expected {want}")
        elif key == "reason_contains":
            missing = [w for w in want if str(w).lower() not in (record.get("reason") or "").lower()]
            if missing:
                problems.append(f"attestation reason {record.get('reason')!r} lacks {missing}")
        elif record.get(key) != want:
            problems.append(f"attestation {key} {record.get(key)!r}, expected {want!r}")
    for run_record in record.get("runs") or []:
        if not run_record.get("output"):
            continue
        try:
            doc = json.loads(Path(world.path(run_record["output"])).read_text())
        except (OSError, ValueError) as err:
            problems.append(f"kept nvattest output {run_record['output']}: {err}")
            continue
        claims = doc.get("claims") if isinstance(doc.get("claims"), list) else []
        digest = hashlib.sha256(json.dumps(claims, sort_keys=True, separators=(",", ":"),
                                           ensure_ascii=False).encode()).hexdigest()
        if claims and run_record.get("claims_sha256") != digest:
            problems.append(f"claims_sha256 of {run_record['output']} is not its claims' SHA-256")
        mode = os.stat(world.path(run_record["output"])).st_mode & 0o777
        if mode != 0o644:
            problems.append(f"{run_record['output']} has mode {mode:o}, not 644")
        if record.get("result") == "passed" and any(
                c.get("eat_nonce") != record.get("nonce") for c in claims):
            problems.append(f"{run_record['output']}: a claim's eat_nonce is not the record's")
    return problems


def attach_problems(attach: dict | None, want: dict) -> list[str]:
    """``expect.<phase>.attach`` (issue 46): ``per_gpu_s`` and ``gpus`` equal status.json's
    ``attach``; ``marks`` its number of marks, their ``gpu`` names ``GPU0``.. in order;
    ``interval_min_s``/``interval_max_s`` bound every interval but the first (null);
    ``null`` in the case: status.json's ``attach`` is null."""
    if want is None:
        return [] if attach is None else [f"status.json attach {attach!r}, expected null"]
    if not isinstance(attach, dict):
        return [f"status.json attach {attach!r}, expected {want!r}"]
    problems = [f"status.json attach.{key} {attach.get(key)!r}, expected {want[key]!r}"
                for key in ("per_gpu_s", "gpus", "rate_source") if key in want
                and attach.get(key) != want[key]]
    marks = attach.get("marks") or []
    if "marks" in want and [m.get("gpu") for m in marks] != [f"GPU{i}" for i in range(want["marks"])]:
        problems.append(f"status.json attach marks {marks!r}, expected GPU0..GPU{want['marks'] - 1}")
    intervals = [m.get("interval_s") for m in marks]
    if marks and intervals[0] is not None:
        problems.append(f"the first attach mark has an interval {intervals[0]!r}, expected null")
    low, high = want.get("interval_min_s"), want.get("interval_max_s")
    for i, value in enumerate(intervals[1:], 1):
        if value is None or (low is not None and value < low) or (high is not None and value > high):
            problems.append(f"attach mark {i} interval {value!r} s is outside [{low}, {high}]")
    return problems


def _status_problems(status: dict, expect: dict) -> list[str]:
    """``state``, ``reason_contains``, ``gpus``, ``nvswitches`` and ``step_messages`` (the
    harness's own: substrings of a step's message) against status.json."""
    problems = []
    if "state" in expect and status.get("state") != expect["state"]:
        problems.append(f"status.json state {status.get('state')!r}, expected {expect['state']!r}")
    reason = status.get("reason") or ""
    missing = [word for word in expect.get("reason_contains") or []
               if str(word).lower() not in reason.lower()]
    if missing:
        problems.append(f"reason {reason!r} lacks {missing}")
    warnings = " | ".join(str(w) for w in status.get("warnings") or [])
    missing = [word for word in expect.get("warnings_contains") or []
               if str(word).lower() not in warnings.lower()]
    if missing:
        problems.append(f"warnings {warnings!r} lack {missing}")
    if "nvidia_ctk_version" in expect and status.get("nvidia_ctk_version") != \
            expect["nvidia_ctk_version"]:  # issue 36: the version the cdi step read
        problems.append(f"status.json nvidia_ctk_version {status.get('nvidia_ctk_version')!r}, "
                        f"expected {expect['nvidia_ctk_version']!r}")
    if "attach" in expect:  # issue 46: persistenced's rate and the attach marks' intervals
        problems += attach_problems(status.get("attach"), expect["attach"])
    if "warnings_only" in expect:  # every warning holds one of these substrings (issue 33)
        allowed = [str(word).lower() for word in expect["warnings_only"] or []]
        others = [str(w) for w in status.get("warnings") or []
                  if not any(word in str(w).lower() for word in allowed)]
        if others:
            problems.append(f"warnings {others!r} are none of {allowed}")
    for key in ("gpus", "nvswitches"):
        if key in expect and len(status.get(key) or []) != expect[key]:
            problems.append(f"status.json lists {len(status.get(key) or [])} {key}, "
                            f"expected {expect[key]}")
    steps = {step.get("name"): step.get("message") or "" for step in status.get("steps") or []
             if isinstance(step, dict)}
    for name, words in (expect.get("step_messages") or {}).items():
        if name not in steps:
            problems.append(f"status.json has no step {name!r} (steps: {sorted(steps)})")
            continue
        missing = [word for word in words if str(word).lower() not in steps[name].lower()]
        if missing:
            problems.append(f"step {name} message {steps[name]!r} lacks {missing}")
    return problems


CRASHED = "the check itself failed"  # podvm_gpu.check.broken's detail: a row that raised


def judge_check(world: World, run: Run, expect: dict) -> list[str]:
    """Problems of a ``check --json`` run against ``expect.check``; empty when it passes."""
    problems = _common(run, expect)
    try:
        document = json.loads(run.stdout)
        results = {check["name"]: check for check in document["checks"]}
    except (ValueError, KeyError, TypeError) as err:
        return problems + [f"check --json stdout is not {{'checks': [{{'name', 'result', ...}}]}}: {err}"]
    for key, result in (("fails", "fail"), ("warns", "warn"), ("passes", "pass"),
                        ("skips", "skip")):
        for name in expect.get(key) or []:
            got = results.get(name, {}).get("result", "missing")
            if got != result:
                problems.append(f"check {name!r} is {got!r}, expected {result!r}"
                                f" ({results.get(name, {}).get('detail', '')})")
    problems += [f"check row {name!r} crashed: {row.get('detail')}" for name, row in results.items()
                 if str(row.get("detail", "")).startswith(CRASHED)]
    problems += _table_problems(document["checks"])
    problems += [f"check is read-only but {shlex.join(call.argv)} applied {call.applied}"
                 for call in run.calls if call.applied]
    if run.root_changes:
        problems.append(f"check is read-only but changed under the root: {run.root_changes[:10]}")
    return problems + order.world_problems(world, run.calls)


def _table_problems(rows: list[dict]) -> list[str]:
    """The table a person sees for this world's rows (the product's own renderer,
    ``podvm_gpu.check.print_table``) at 80 and 100 columns: no line wider (issue 35 item 3)."""
    import contextlib
    import io

    from podvm_gpu.check import print_table
    from podvm_gpu.row import Check

    checks = [Check(str(r.get("name")), str(r.get("result")), str(r.get("detail", "")),
                    str(r.get("hint", ""))) for r in rows]
    summary = {result: sum(c.result == result for c in checks)
               for result in ("pass", "warn", "fail", "skip")}
    problems = []
    for width in (80, 100):
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            print_table(checks, summary, width)
        wide = [line for line in shown.getvalue().splitlines() if len(line) > width]
        if wide:
            problems.append(f"check's table at {width} columns has {len(wide)} wider line(s): "
                            f"{wide[0]!r}")
    return problems


def _common(run: Run, expect: dict) -> list[str]:
    """Exit code, a run the harness had to end, and fakes that failed to apply an effect."""
    problems = []
    if run.rc is None:
        problems.append(f"did not exit within {run.limit_s:.0f} s; the harness killed it")
    elif "exit" in expect and run.rc != expect["exit"]:
        problems.append(f"exit code {run.rc}, expected {expect['exit']}")
    problems += [f"harness error in fake {shlex.join(call.argv)}: {message}"
                 for call in run.calls for message in call.errors]
    return problems


def judge_cdi(world: World, expected: str, state: str | None, status: dict) -> list[str]:
    """``cdi: ready-spec | unavailable | absent`` (EFFECTS.md, expect keys)."""
    path = world.path(CDI_PATH)
    problems = [f"another spec in /var/run/cdi defines {KIND}: {name}"
                for name in _other_specs(os.path.dirname(path))]
    if expected == "absent":
        return problems + ([f"{CDI_PATH} exists, expected none"] if os.path.lexists(path) else [])
    spec, error = _load_spec(path)
    if error:
        return problems + [error]
    problems += [f"spec fails the CDI schema at /{'/'.join(map(str, err.path))}: {err.message}"
                 for err in list(cdi_schema().iter_errors(spec))[:5]]
    if spec.get("kind") != KIND:
        problems.append(f"spec kind {spec.get('kind')!r}, expected {KIND!r}")
    if expected == "unavailable":
        return problems + _unavailable(spec, state, status)
    return problems + _ready(world, spec)


def _unavailable(spec: dict, state: str | None, status: dict) -> list[str]:
    """Contract section 2: one device ``unavailable`` whose edits carry the state and the reason."""
    problems = []
    if spec.get("cdiVersion") != UNAVAILABLE_CDI_VERSION:
        problems.append(f"unavailable spec cdiVersion {spec.get('cdiVersion')!r}, "
                        f"expected {UNAVAILABLE_CDI_VERSION!r}")
    devices = spec.get("devices") or []
    if [device.get("name") for device in devices] != ["unavailable"]:
        return problems + [f"unavailable spec devices {_device_names(spec)}, expected ['unavailable']"]
    env = (devices[0].get("containerEdits") or {}).get("env") or []
    if f"PODVM_GPU_STATE={state}" not in env:
        problems.append(f"unavailable spec env {env} lacks PODVM_GPU_STATE={state}")
    reasons = [entry.split("=", 1)[1] for entry in env if entry.startswith("PODVM_GPU_REASON=")]
    if len(reasons) != 1 or "\n" in reasons[0]:
        problems.append(f"unavailable spec env {env} needs one one-line PODVM_GPU_REASON")
    elif isinstance(status.get("reason"), str) and reasons[0] != status["reason"]:
        problems.append(f"PODVM_GPU_REASON {reasons[0]!r} is not the status reason {status['reason']!r}")
    return problems


def _ready(world: World, spec: dict) -> list[str]:
    """Contract section 8 for a ready boot: devices 0..N-1 and all, device nodes real, hooks runnable."""
    problems = []
    names = _device_names(spec)
    wanted = [str(index) for index in range(world.case.gpu_count)] + ["all"]
    if missing := [name for name in wanted if name not in names]:
        problems.append(f"spec lacks devices {missing} (has {sorted(names)})")
    edits = [spec.get("containerEdits") or {}]
    edits += [device.get("containerEdits") or {} for device in spec.get("devices") or []]
    nodes = [node for edit in edits for node in edit.get("deviceNodes") or []]
    minors = _gpu_minors(world)
    required = list(REQUIRED_NODES) + [f"/dev/nvidia{minor}" for minor in minors]
    paths = {node.get("path") for node in nodes}
    if missing := [path for path in required if path not in paths]:
        problems.append(f"spec lacks device nodes {missing}")
    for node in nodes:
        problems += _node_problems(world, node)
    for hook in (hook for edit in edits for hook in edit.get("hooks") or []):
        path = world.path(hook.get("path", ""))
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            problems.append(f"hook {hook.get('path')} is not an executable file under the root")
    return list(dict.fromkeys(problems))


def _node_problems(world: World, node: dict) -> list[str]:
    """A device node must be a character device under the root (``hostPath`` as written, else
    ``path`` under the root) with the spec's major and minor."""
    written = node.get("hostPath")
    real = os.path.realpath(written) if written else world.path(node.get("path", ""))
    shown = written or node.get("path")
    if not real.startswith(os.path.realpath(world.layout.root) + os.sep):
        return [f"device node {shown} is outside the root (nvidia-ctk without --dev-root?)"]
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return [f"device node {shown} does not exist"]
    if not stat.S_ISCHR(info.st_mode):
        return [f"device node {shown} is not a character device"]
    want = (node.get("major"), node.get("minor", 0))
    if want[0] is not None and want != (os.major(info.st_rdev), os.minor(info.st_rdev)):
        return [f"device node {shown} is {os.major(info.st_rdev)}:{os.minor(info.st_rdev)}, "
                f"the spec says {want[0]}:{want[1]}"]
    return []


def _gpu_minors(world: World) -> list[int]:
    """Minors from the root's ``/proc/driver/nvidia/gpus/*/information``."""
    folder = Path(world.path("/proc/driver/nvidia/gpus"))
    minors = []
    for information in sorted(folder.glob("*/information")) if folder.is_dir() else []:
        for line in information.read_text().splitlines():
            label, _, value = line.partition(":")
            if label.strip() == "Device Minor" and value.strip().isdigit():
                minors.append(int(value))
    return minors


def _load_spec(path: str) -> tuple[dict, str | None]:
    """(spec, None), or ({}, why) when the file is missing or is not a YAML/JSON mapping."""
    try:
        spec = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        return {}, f"no CDI spec at {CDI_PATH}"
    except (OSError, yaml.YAMLError) as err:
        return {}, f"{CDI_PATH} does not parse: {err}"
    return (spec, None) if isinstance(spec, dict) else ({}, f"{CDI_PATH} is not a mapping")


def _device_names(spec: dict) -> set[str]:
    return {str(device.get("name")) for device in spec.get("devices") or [] if isinstance(device, dict)}


def _other_specs(folder: str) -> list[str]:
    """Files in ``/var/run/cdi`` other than nvidia.yaml that CDI readers load and that define KIND."""
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name == "nvidia.yaml" or not name.endswith((".yaml", ".json")):
            continue
        spec, error = _load_spec(os.path.join(folder, name))
        if not error and spec.get("kind") == KIND:
            found.append(name)
    return found


def _killed(run: Run, tool: str) -> list[str]:
    """``not_killed``: each process of ``tool`` was alive when the run ended, or ended on its own."""
    problems = []
    for call in run.calls:
        if call.argv[0] != tool:
            continue
        if call.signals:
            problems.append(f"{tool} (pid {call.pid}) was sent {call.signals}")
        elif call.rc is None and call.pid not in run.alive_at_exit:
            problems.append(f"{tool} (pid {call.pid}) was killed: gone before it answered")
    problems += [f"{tool} stand-in daemon (pid {daemon['pid']}) was killed"
                 for daemon in run.daemons
                 if daemon["tool"] == tool and daemon["pid"] not in run.alive_at_exit]
    return problems


def report(world: World, run: Run, problems: list[str]) -> str:
    """The failure message: the problems, the command, status.json, output tails and every call."""
    case = world.case
    kept = os.environ.get("PODVM_GPU_KEEP_WORLD") == "1"
    lines = [f"{case.id} ({case.path}): {run.phase} has {len(problems)} problem(s):"]
    lines += [f"  - {problem}" for problem in problems]
    lines += ["", f"command: {shlex.join(run.argv)}",
              f"exit {run.rc}, {run.wall_s:.2f} s; world {world.layout.dir} "
              + ("kept" if kept else "(removed; PODVM_GPU_KEEP_WORLD=1 keeps it)"),
              "", "status.json:"]
    lines.append(_indent(json.dumps(run.status, indent=2) if run.status else str(run.status_error)))
    lines += ["", "stdout (last 20 lines):", _indent(_tail(run.stdout, 20)),
              "", "stderr (last 40 lines):", _indent(_tail(run.stderr, 40)),
              "", "late PCI devices added during this run:"]
    lines += [f"  {a['address']} at {a['at_s']:.2f} s: added to {a['testbeds']} testbed(s), "
              f"add uevent to {a['monitors']} libudev monitor(s)" for a in run.arrivals] or \
        ["  (none)"]
    lines += ["", "calls (all runs of this world):"]
    lines += [f"  [{call.run}] {shlex.join(call.argv)} -> {describe_call(call)}" for call in world.calls()]
    return "\n".join(lines)


def describe_call(call: Call) -> str:
    """``rc 0 (rule 3), 0.02 s``, ``rc 127 (unmatched)``, ``killed (SIGTERM)``, ``no exit recorded``."""
    if call.signals:
        return f"killed ({', '.join(call.signals)})"
    if call.rc is None:
        return "no exit recorded (still running when the run ended, or killed)"
    return f"rc {call.rc} ({call.answer}), {call.ended - call.started:.2f} s"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _tail(text: str, count: int) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-count:]) or "(empty)"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
