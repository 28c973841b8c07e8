#!/usr/bin/env python3
"""The FSDP step pictures (examples/fsdp_figures) against the run's own logs.

Runs fsdp_figures into a temporary directory three times (FSDP on 4 ranks;
HSDP 2x2 with reshard_after_forward=false; 3 ranks, where most parameters
shard unevenly, without prefetch) and checks, from the data file and the
SVGs alone:
  - bytes: each unit's collectives are what its parameter shapes say, per rank
    (all-gather (S-1) * slot bytes, reduce-scatter (S-1) * (slot + one flag per
    parameter) * 4, HSDP's all-reduce 2(R-1)/R of that), summed they are what
    the process groups counted, and NaiveFSDP moves one chunk per parameter;
  - trace: every collective the stats counted is an event with its bytes, and
    every unit has one forward and one backward span per rank;
  - memory: each layer is what it claims (shards and optimizer state from the
    shapes, unsharded bytes per unit at each hook, sharded gradients after
    backward), and the layers add up to the rank's live bytes;
  - losses: one rank, fully_shard, deterministic mode and NaiveFSDP bitwise
    equal (tests/fsdp/test_equivalence.cpp); HSDP equal at step 1, where no
    summation order has acted yet;
  - pictures: every data-* value of every SVG equals the JSON's plotted
    number, and that number is the raw figure it was derived from.
Then it corrupts one number at a time in copies of the output and requires
each check to notice: the checks can fail.

usage: check_fsdp_figures.py FSDP_FIGURES_BINARY
"""
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

SVG = "{http://www.w3.org/2000/svg}"
F32 = 4  # bytes per element: the run is f32 throughout
MAX_PICTURE_BYTES = 64 * 1024


class Mismatch(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise Mismatch(message)


# ---- shapes ---------------------------------------------------------------------------------

def rows_and_row_numel(shape):
    return shape[0], math.prod(shape[1:])


def slot_numel(parameters, ranks):
    """Elements of one rank's slot: each parameter's ceil(rows / ranks) rows."""
    total = 0
    for parameter in parameters:
        rows, row_numel = rows_and_row_numel(parameter["shape"])
        total += -(-rows // ranks) * row_numel
    return total


def unsharded_numel(parameters):
    return sum(math.prod(parameter["shape"]) for parameter in parameters)


def local_numel(parameters, ranks, rank):
    """Elements of `rank`'s rows of each parameter (the last ranks may hold fewer)."""
    total = 0
    for parameter in parameters:
        rows, row_numel = rows_and_row_numel(parameter["shape"])
        chunk = -(-rows // ranks)
        total += max(0, min(rows, (rank + 1) * chunk) - rank * chunk) * row_numel
    return total


# ---- the checks -------------------------------------------------------------------------------

def expected_unit_comm(data, unit):
    """What one rank's collectives for `unit` must be in one step."""
    options = data["options"]
    shards, replicate = options["shard"], options["replicate"]
    parameters = unit["parameters"]
    slot = slot_numel(parameters, shards)
    after_forward = options["reshard_after_forward"]
    gathers = [slot * F32 * (shards - 1)]
    if unit["module"] != "root" and shards > 1:  # the root is never resharded after forward
        if after_forward == "true":
            gathers.append(slot * F32 * (shards - 1))
        elif after_forward != "false":
            group = int(after_forward)
            gathers.append(slot_numel(parameters, group) * F32 * (group - 1))
    expected = {"all_gather_into": {"calls": len(gathers), "bytes": sum(gathers)}}
    gradient_slot = (slot + len(parameters)) * F32  # + one presence flag per parameter
    expected["reduce_scatter_into"] = {"calls": 1, "bytes": (shards - 1) * gradient_slot}
    if replicate > 1:
        expected["all_reduce"] = {"calls": 1, "bytes": 2 * (replicate - 1) * gradient_slot // replicate}
    return expected


def same_stats(actual, expected, where):
    expect(set(actual) == set(expected), f"{where}: collectives {sorted(actual)}, expected {sorted(expected)}")
    for kind, want in expected.items():
        got = actual[kind]
        expect(got["calls"] == want["calls"], f"{where}: {got['calls']} {kind} calls, expected {want['calls']}")
        expect(got["bytes_sent"] == want["bytes"] and got["bytes_received"] == want["bytes"],
               f"{where}: {kind} sent {got['bytes_sent']} and received {got['bytes_received']} bytes, "
               f"expected {want['bytes']} each way")


def check_bytes(data):
    options = data["options"]
    totals_by_rank = []
    for rank, record in enumerate(data["fully_shard"]["ranks"]):
        total = {}
        for unit in data["units"]:
            expected = expected_unit_comm(data, unit)
            same_stats(record["unit_comm"][unit["module"]], expected, f"rank {rank} unit {unit['module']}")
            for kind, want in expected.items():
                entry = total.setdefault(kind, {"calls": 0, "bytes": 0})
                entry["calls"] += want["calls"]
                entry["bytes"] += want["bytes"]
        totals_by_rank.append(total)
        # What FSDP counted is what the process groups carried (no other traffic in the step).
        if options["reshard_after_forward"] in ("true", "false"):
            carried = {}
            for stats in record["group_comm"].values():
                for kind, entry in stats.items():
                    carried[kind] = {"calls": entry["calls"], "bytes_sent": entry["bytes_sent"],
                                     "bytes_received": entry["bytes_received"]}
            same_stats(carried, total, f"rank {rank}: the process groups' own counts")
    # NaiveFSDP: one all-gather and one reduce-scatter per parameter over the world.
    ranks = options["ranks"]
    parameters = [parameter for unit in data["units"] for parameter in unit["parameters"]]
    chunk_bytes = slot_numel(parameters, ranks) * F32
    naive_expected = {kind: {"calls": len(parameters), "bytes": (ranks - 1) * chunk_bytes}
                      for kind in ("all_gather_into", "reduce_scatter_into")}
    for rank, record in enumerate(data["naive"]["ranks"]):
        same_stats(record["group_comm"]["world"], naive_expected, f"NaiveFSDP rank {rank}")
    return totals_by_rank


def check_trace(data):
    options = data["options"]
    for run in ("fully_shard", "naive"):
        events = data[run]["events"]
        for rank, record in enumerate(data[run]["ranks"]):
            counted = {}
            for stats in (record["unit_comm"].values() if run == "fully_shard" else record["group_comm"].values()):
                for kind, entry in stats.items():
                    counted.setdefault(kind, [0, 0])
                    counted[kind][0] += entry["calls"]
                    counted[kind][1] += entry["bytes_sent"]
            traced = {}
            for event in events:
                if event["rank"] == rank and event["track"].startswith("comm:"):
                    traced.setdefault(event["name"], [0, 0])
                    traced[event["name"]][0] += 1
                    traced[event["name"]][1] += event["args"]["bytes_sent"]
            expect(traced == counted, f"{run} rank {rank}: the trace has collectives {traced} (calls, bytes sent), "
                                      f"the stats counted {counted}")
        for event in events:
            expect(event["duration_us"] >= 0 and event["start_us"] >= 0, f"{run}: event {event} has a negative time")
            drawn = event["kind"] is not None
            expect(drawn == (event["lane"] is not None), f"{run}: event {event} has a lane or a kind but not both")
            expect(drawn or (event["track"] == "fsdp" and event["name"] in ("forward", "backward")),
                   f"{run}: event {event} is left out of the timeline")
    # Every unit ran forward and backward once on every rank.
    for rank in range(options["ranks"]):
        for phase in ("forward", "backward"):
            modules = sorted(event["args"]["module"] or "root" for event in data["fully_shard"]["events"]
                             if event["rank"] == rank and event["track"] == "fsdp" and event["name"] == phase)
            expect(modules == sorted(unit["module"] for unit in data["units"]),
                   f"rank {rank}: FSDP {phase} spans of {modules}")


def merged(intervals):
    out = []
    for begin, end in sorted(intervals):
        if out and begin <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([begin, end])
    return out


def covered(intervals):
    return sum(end - begin for begin, end in intervals)


def recomputed_time(events, rank):
    """A rank's step, compute, FSDP-lane and communication time, and the
    communication hidden behind compute, recomputed microsecond by
    microsecond from its drawn events (the data file's time_per_rank entry)."""
    mine = [event for event in events if event["rank"] == rank]
    lanes = {"compute": [], "FSDP": [], "communication": []}
    for event in mine:
        if event["lane"] is None:
            continue
        lane = event["lane"][len(f"rank {rank} "):]
        span = (event["start_us"], event["start_us"] + event["duration_us"])
        lanes[lane if lane in lanes else "communication"].append(span)
    busy = {lane: merged(spans) for lane, spans in lanes.items()}
    working = [t for begin, end in busy["compute"] for t in range(begin, end)]
    blocked = {t for begin, end in busy["FSDP"] for t in range(begin, end)}
    talking = {t for begin, end in busy["communication"] for t in range(begin, end)}
    hidden = sum(1 for t in working if t not in blocked and t in talking)
    return {"rank": rank, "step_us": max(e["start_us"] + e["duration_us"] for e in mine),
            "compute_us": covered(busy["compute"]), "fsdp_us": covered(busy["FSDP"]),
            "communication_us": covered(busy["communication"]), "hidden_us": hidden}


def check_time_per_rank(data):
    for run in ("fully_shard", "naive"):
        for entry in data[run]["time_per_rank"]:
            expected = recomputed_time(data[run]["events"], entry["rank"])
            expect(entry == expected, f"{run} rank {entry['rank']}: time {entry}, recomputed {expected}")
        if run == "naive":  # blocking collectives: nothing runs behind compute
            expect(all(entry["hidden_us"] == 0 for entry in data[run]["time_per_rank"]),
                   "NaiveFSDP hid communication behind compute")


def check_memory(data):
    options = data["options"]
    shards, ranks = options["shard"], options["ranks"]
    units = {unit["module"]: unit["parameters"] for unit in data["units"]}
    blocks = [name for name in units if name != "root"]
    padded_shards = sum(slot_numel(parameters, shards) for parameters in units.values()) * F32
    parameter_count = sum(len(parameters) for parameters in units.values())
    for rank, record in enumerate(data["fully_shard"]["ranks"]):
        shard_rank = rank % shards
        local = sum(local_numel(parameters, shards, shard_rank) for parameters in units.values()) * F32
        expect(record["shards_allocated_bytes"] == padded_shards,
               f"rank {rank}: materialising allocated {record['shards_allocated_bytes']} bytes, the padded shards "
               f"are {padded_shards}")
        readings = record["memory_bytes"]
        expect([reading["stage"] for reading in readings] ==
               ["start", "fwd root"] + [f"fwd {i}" for i in range(len(blocks))] + ["loss"] +
               [f"bwd {i}" for i in reversed(range(len(blocks)))] + ["grads", "step"],
               f"rank {rank}: stages {[reading['stage'] for reading in readings]}")
        for reading in readings:
            where = f"rank {rank} at {reading['stage']}"
            layers = ("shards", "optimizer", "gradients", "unsharded", "activations_and_buffers")
            expect(all(reading[layer] >= 0 for layer in layers), f"{where}: a negative layer in {reading}")
            expect(sum(reading[layer] for layer in layers) == reading["live"], f"{where}: layers do not add up")
            expect(reading["live"] <= record["peak_bytes"], f"{where}: live above the step's peak")
            expect(reading["shards"] == padded_shards, f"{where}: shards {reading['shards']}, expected {padded_shards}")
            # AdamW: exp_avg and exp_avg_sq of each local shard, an 8-byte step count per parameter.
            expect(reading["optimizer"] == 2 * local + 8 * parameter_count,
                   f"{where}: optimizer state {reading['optimizer']}, expected {2 * local + 8 * parameter_count}")
            expect(reading["unsharded"] == sum(reading["unsharded_by_unit"].values()),
                   f"{where}: unsharded memory is not the sum over units")
        check_unsharded_by_stage(data, readings, units, blocks, shards, rank)
        by_stage = {reading["stage"]: reading for reading in readings}
        for stage in ("grads", "step"):  # after backward: one sharded gradient per parameter, nothing unsharded
            expect(by_stage[stage]["gradients"] == local, f"rank {rank} at {stage}: gradients "
                                                          f"{by_stage[stage]['gradients']}, expected {local}")
            expect(by_stage[stage]["unsharded"] == 0, f"rank {rank} at {stage}: parameters left unsharded")
        expect(by_stage["start"]["gradients"] == 0, f"rank {rank}: gradients before the step (zero_grad frees them)")


def check_unsharded_by_stage(data, readings, units, blocks, shards, rank):
    """At each hook, which units hold what: a unit in use holds its unsharded
    parameters (unpadded, the all-gather buffer freed by copy-out); the unit
    prefetched next holds its all-gather buffer (every rank's padded slot)."""
    options = data["options"]
    if options["reshard_after_forward"] not in ("true", "false"):
        return
    keep = options["reshard_after_forward"] == "false"
    whole = {name: unsharded_numel(parameters) * F32 for name, parameters in units.items()}
    buffer = {name: shards * slot_numel(parameters, shards) * F32 for name, parameters in units.items()}

    def expected_at(stage):
        held = {name: 0 for name in units}
        if stage in ("start", "grads", "step"):
            return held
        held["root"] = whole["root"]  # gathered by the first forward, resharded at the end of backward
        phase, _, index = stage.partition(" ")
        if phase == "fwd":
            current = -1 if index == "root" else int(index)
            for i in range(current + 1):
                if i == current or keep:
                    held[blocks[i]] = whole[blocks[i]]
            if options["prefetch"] and current + 1 < len(blocks):
                held[blocks[current + 1]] = buffer[blocks[current + 1]]
        elif phase == "loss":
            if keep:
                for name in blocks:
                    held[name] = whole[name]
        elif phase == "bwd":
            current = int(index)
            for i in range(current + 1):
                if i == current or keep:
                    held[blocks[i]] = whole[blocks[i]]
            if options["prefetch"] and current > 0 and not keep:
                held[blocks[current - 1]] = buffer[blocks[current - 1]]
        return held

    for reading in readings:
        expected = expected_at(reading["stage"])
        expect(reading["unsharded_by_unit"] == expected,
               f"rank {rank} at {reading['stage']}: unsharded bytes per unit {reading['unsharded_by_unit']}, "
               f"expected {expected}")


def check_losses(data):
    one_rank = data["one_rank"]["losses"]
    sharded = data["fully_shard"]["losses"]
    expect(len(one_rank) == data["options"]["steps"], "a loss per step")
    expect(data["fully_shard_deterministic"]["losses"] == sharded,
           "deterministic mode changed the losses: the local backend always reduces in rank order")
    expect(data["naive"]["losses"] == one_rank, "NaiveFSDP's losses are not bitwise one rank's")
    if data["options"]["replicate"] == 1:
        expect(sharded == one_rank, f"fully_shard's losses {sharded} are not bitwise one rank's {one_rank}")
    else:
        expect(sharded[0] == one_rank[0], "HSDP's first loss (no update yet) differs from one rank's")
    differences = data["loss_max_abs_difference_from_one_rank"]
    expect(differences["naive"] == 0.0 and differences["fully_shard"] == max(
        abs(a - b) for a, b in zip(sharded, one_rank)), f"the recorded differences {differences} are not the runs'")


# ---- the pictures ------------------------------------------------------------------------------

def svg_elements(path, css_class):
    expect(os.path.getsize(path) <= MAX_PICTURE_BYTES, f"{path} is {os.path.getsize(path)} bytes")
    root = ElementTree.parse(path).getroot()
    return [element for element in root.iter() if element.get("class") == css_class]


def check_timeline(data, run, path):
    figure = data["figures"][os.path.basename(path)]
    expected = []
    for lane in figure["lanes"]:
        for event in data[run]["events"]:
            if event["lane"] == lane:
                expected.append((lane, event["kind"], event["start_us"] / 1000,
                                 (event["start_us"] + event["duration_us"]) / 1000))
    drawn = [(span.get("data-lane"), span.get("data-kind"), float(span.get("data-start")),
              float(span.get("data-end"))) for span in svg_elements(path, "span")]
    expect(drawn == expected, f"{path}: {len(drawn)} spans drawn, {len(expected)} in the data, first difference "
                              f"{next((pair for pair in zip(drawn, expected) if pair[0] != pair[1]), None)}")
    expect(figure["kinds"][:3] == ["forward", "backward", "optimizer"], f"{path}: kinds {figure['kinds']}")


def check_bars(figure, path):
    drawn = [(bar.get("data-category"), bar.get("data-layer"), float(bar.get("data-value")))
             for bar in svg_elements(path, "bar")]
    expected = [(category, layer["label"], layer["values"][index])
                for index, category in enumerate(figure["categories"]) for layer in figure["layers"]]
    expect(drawn == expected, f"{path}: the bars are not the data file's")


def check_memory_picture(data, path):
    figure = data["figures"][os.path.basename(path)]
    check_bars(figure, path)
    readings = data["fully_shard"]["ranks"][0]["memory_bytes"]
    keys = {"parameter shards": "shards", "optimizer state": "optimizer", "gradients": "gradients",
            "unsharded parameters": "unsharded", "activations and buffers": "activations_and_buffers"}
    expect(figure["categories"] == [reading["stage"] for reading in readings], f"{path}: categories")
    for layer in figure["layers"]:
        expect(layer["values"] == [reading[keys[layer["label"]]] / 1024 for reading in readings],
               f"{path}: layer {layer['label']} is not rank 0's readings in KiB")


def check_bytes_picture(data, path, totals):
    figure = data["figures"][os.path.basename(path)]
    check_bars(figure, path)
    rank0 = data["fully_shard"]["ranks"][0]
    names = {"all-gather": "all_gather_into", "reduce-scatter": "reduce_scatter_into",
             "all-reduce (HSDP)": "all_reduce"}
    expect(sorted(names[layer["label"]] for layer in figure["layers"]) == sorted(totals[0]),
           f"{path}: layers {[layer['label'] for layer in figure['layers']]}")
    naive = data["naive"]["ranks"][0]["group_comm"]["world"]
    for layer in figure["layers"]:
        kind = names[layer["label"]]
        expected = []
        for category in figure["categories"]:
            if category == "all units":
                expected.append(totals[0][kind]["bytes"] / 1024)
            elif category == "NaiveFSDP":
                expected.append(naive.get(kind, {"bytes_sent": 0})["bytes_sent"] / 1024)
            else:
                expected.append(rank0["unit_comm"][category].get(kind, {"bytes_sent": 0})["bytes_sent"] / 1024)
        expect(layer["values"] == expected, f"{path}: {layer['label']} is not the bytes sent in KiB")


def check_loss_picture(data, path):
    figure = data["figures"][os.path.basename(path)]
    runs = [data["one_rank"], data["fully_shard"], data["fully_shard_deterministic"], data["naive"]]
    lines = svg_elements(path, "series")
    expect(len(lines) == len(runs) == len(figure["series"]), f"{path}: {len(lines)} curves")
    for line, series, run in zip(lines, figure["series"], runs):
        points = [tuple(float(value) for value in pair.split(",")) for pair in line.get("data-points").split()]
        expect(points == list(zip(series["x"], series["y"])), f"{path}: curve {series['label']} is not the data's")
        expect(series["y"] == run["losses"] and series["x"] == list(range(1, len(run["losses"]) + 1)),
               f"{path}: curve {series['label']} is not its run's losses")


def load(path):
    """The data file, each trace event as a dict of its columns."""
    with open(path) as file:
        data = json.load(file)
    for run in ("fully_shard", "naive"):
        columns = data[run]["event_columns"]
        data[run]["events"] = [dict(zip(columns, row)) for row in data[run]["events"]]
    return data


def check_output(directory, name):
    data = load(os.path.join(directory, name + ".json"))
    picture = lambda suffix: os.path.join(directory, f"{name}_{suffix}.svg")  # noqa: E731
    totals = check_bytes(data)
    check_trace(data)
    check_time_per_rank(data)
    check_memory(data)
    check_losses(data)
    check_timeline(data, "naive", picture("timeline_naive"))
    check_timeline(data, "fully_shard", picture("timeline"))
    check_memory_picture(data, picture("memory"))
    check_bytes_picture(data, picture("bytes"), totals)
    check_loss_picture(data, picture("loss"))
    return data


# ---- the checks must be able to fail -----------------------------------------------------------

def must_fail(what, check):
    try:
        check()
    except Mismatch as mismatch:
        print(f"  corrupted {what}: caught ({str(mismatch)[:100]})")
        return
    raise Mismatch(f"corrupting {what} went unnoticed")


def check_corruptions(directory, name, data):
    def corrupted(change):
        broken = copy.deepcopy(data)
        change(broken)
        return broken

    def more_bytes(broken):
        broken["fully_shard"]["ranks"][1]["unit_comm"]["blocks.1"]["all_gather_into"]["bytes_sent"] += F32

    def lost_event(broken):
        events = broken["fully_shard"]["events"]
        events.remove(next(event for event in events if event["name"] == "reduce_scatter_into"))

    def rounded_loss(broken):
        broken["naive"]["losses"][-1] = math.nextafter(broken["naive"]["losses"][-1], 0.0)

    def moved_gradient(broken):
        reading = broken["fully_shard"]["ranks"][0]["memory_bytes"][-1]
        reading["gradients"] -= F32
        reading["activations_and_buffers"] += F32

    must_fail("a unit's all-gather bytes", lambda: check_bytes(corrupted(more_bytes)))
    must_fail("a lost reduce-scatter event", lambda: check_trace(corrupted(lost_event)))
    must_fail("a microsecond more of hidden communication",
              lambda: check_time_per_rank(corrupted(lambda broken: broken["fully_shard"]["time_per_rank"][3].update(
                  hidden_us=broken["fully_shard"]["time_per_rank"][3]["hidden_us"] + 1))))
    must_fail("the last NaiveFSDP loss by one ulp", lambda: check_losses(corrupted(rounded_loss)))
    must_fail("4 gradient bytes counted as activations", lambda: check_memory(corrupted(moved_gradient)))
    # A picture that shows another number than its data: one span's end, in a copy of the SVG.
    timeline = os.path.join(directory, f"{name}_timeline.svg")
    with open(timeline) as file:
        text = file.read()
    marker = 'data-end="'
    at = text.index(marker) + len(marker)
    end = text.index('"', at)
    broken = os.path.join(directory, f"broken_{name}_timeline.svg")
    with open(broken, "w") as file:
        file.write(text[:at] + repr(float(text[at:end]) + 0.001) + text[end:])
    broken_data = corrupted(lambda copied: copied["figures"].__setitem__(
        f"broken_{name}_timeline.svg", copied["figures"][f"{name}_timeline.svg"]))
    must_fail("a timeline span's end in the SVG", lambda: check_timeline(broken_data, "fully_shard", broken))


def run_and_check(binary, directory, name, flags, check):
    """Runs the figures program into `directory` as `name` and returns check(directory, name); exits with the
    program's output when it fails, and with the mismatch when a check does."""
    started = time.monotonic()
    command = [binary, "--out", directory, "--name", name] + flags
    completed = subprocess.run(command, capture_output=True, text=True, timeout=240)
    if completed.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({completed.returncode}):\n{completed.stdout}{completed.stderr}")
    print(f"{' '.join(command[1:])}: {time.monotonic() - started:.1f} s")
    try:
        return check(directory, name)
    except Mismatch as mismatch:
        sys.exit(f"{name}: {mismatch}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    runs = [("plain", ["--steps", "5"]),
            ("hsdp", ["--steps", "3", "--hsdp", "2", "--reshard-after-forward", "false"]),
            ("uneven", ["--steps", "2", "--ranks", "3", "--no-prefetch"])]
    with tempfile.TemporaryDirectory() as directory:
        results = {}
        for name, flags in runs:
            results[name] = run_and_check(binary, directory, name, flags, check_output)
            print(f"  {name}: bytes, trace, memory, losses and pictures agree")
        try:
            check_corruptions(directory, "plain", results["plain"])
        except Mismatch as mismatch:
            sys.exit(str(mismatch))
    print("fsdp figures: every picture is its run's data")


if __name__ == "__main__":
    main()
