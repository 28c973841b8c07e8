#!/usr/bin/env python3
"""The tensor-parallel step pictures (examples/fsdp_figures/tp_figures) against
the run's own logs and the parameters' shapes.

Runs tp_figures into a temporary directory ((dp 2, tp 2) on 4 ranks, and
(dp 3, tp 2) on 6, where FSDP splits pieces unevenly) and checks, from the
data file and the SVGs alone:
  - layout: every parameter's piece on each tp rank is what its placement
    says of its 1-rank shape (Shard(d), in sections for the fused qkv; the
    vocabulary split ceil-first), and Replicate keeps it whole;
  - bytes: per rank, the tp group's all-gathers and reduce-scatters are the
    activations' moves of the GPT plan ((2L + 1) of [B, T/tp, C] each way,
    and the position rows' gradient), its all-reduces the loss's three rows
    and FSDP's sums of the partial gradients' dp shards; the dp group's are
    FSDP's over each tp rank's pieces; FSDP's own counters agree;
  - trace: every collective the groups counted is an event with its bytes;
  - memory: the shards, optimizer state, gradients and gathered parameters
    are what the pieces' dp rows say at each stage;
  - losses: as one rank on the global batch (step 1 within 1e-5, every step
    within 1e-4, relative), and falling;
  - pictures: every data-* value of every SVG is the JSON's plotted number,
    and that number is the raw figure it was derived from;
  - the page: docs/tp_step_by_step.md's tables of bytes and memory are the
    run's numbers.
Then it corrupts one number at a time and requires each check to notice.

usage: check_tp_figures.py TP_FIGURES_BINARY
"""
import copy
import json
import math
import os
import sys
import tempfile

import check_fsdp_figures as fsdp_check
from check_fsdp_figures import Mismatch, expect, must_fail, recomputed_time, run_and_check

F32 = 4
I64 = 8
fsdp_check.MAX_PICTURE_BYTES = 160 * 1024  # four ranks' lanes


def ceil_div(a, b):
    return -(-a // b)


def chunk(size, shards, index):
    """dist::shard_extent's length: ceil-sized chunks, the last ones shorter or empty."""
    step = ceil_div(size, shards)
    offset = min(index * step, size)
    return min(step, size - offset)


def row_numel(shape):
    return math.prod(shape[1:])


# ---- layout ------------------------------------------------------------------------------------

def expected_piece(parameter, tp, rank):
    shape = list(parameter["logical"])
    placement = parameter["placement"]
    if placement.startswith("Replicate"):
        return shape
    dim = int(placement[len("Shard("):-1])
    sections = parameter["sections"]
    section = shape[dim] // sections
    shape[dim] = sections * chunk(section, tp, rank)
    return shape


def check_layout(data):
    tp = data["options"]["tp"]
    for parameter in data["parameters"]:
        expect(len(parameter["pieces"]) == tp, f"{parameter['name']}: {len(parameter['pieces'])} pieces")
        for rank, piece in enumerate(parameter["pieces"]):
            expect(piece == expected_piece(parameter, tp, rank),
                   f"{parameter['name']} on tp rank {rank}: piece {piece}, expected "
                   f"{expected_piece(parameter, tp, rank)}")
    names = {parameter["name"]: parameter for parameter in data["parameters"]}
    expect(names["blocks.0.ln1.weight"]["partial_gradient"] and names["blocks.0.attn.proj.bias"]["partial_gradient"]
           and not names["blocks.0.attn.qkv.bias"]["partial_gradient"], "partial gradients: the wrong parameters")


# ---- bytes -------------------------------------------------------------------------------------

def units(data):
    order = []
    for parameter in data["parameters"]:
        if parameter["unit"] not in order:
            order.append(parameter["unit"])
    return order


def unit_parameters(data, unit):
    return [parameter for parameter in data["parameters"] if parameter["unit"] == unit]


def slot_numel(parameters, tp_rank, dp):
    return sum(ceil_div(p["pieces"][tp_rank][0], dp) * row_numel(p["pieces"][tp_rank]) for p in parameters)


def all_reduce_sent(nbytes, ranks):
    return 2 * (ranks - 1) * nbytes // ranks


def expected_group_comm(data, tp_rank):
    """The step's collectives on the tp and dp groups of a rank at tp coordinate tp_rank."""
    options = data["options"]
    model = options["model"]
    tp, dp = options["tp"], options["dp"]
    batch, seq, width, layers = options["batch"], options["seq_len"], model["n_embd"], model["n_layer"]
    slice_bytes = batch * seq // tp * width * F32
    moves = 2 * layers + 1  # into attention and the MLP of each block, and the embedding or the head
    positions = seq // tp * width * F32
    partial_calls, partial_bytes = 0, 0
    gather_calls, gather_bytes, scatter_calls, scatter_bytes = 0, 0, 0, 0
    for unit in units(data):
        parameters = unit_parameters(data, unit)
        slot = slot_numel(parameters, tp_rank, dp)
        gathers = 1 if unit == "root" else 2  # the root keeps its parameters for backward
        gather_calls += gathers
        gather_bytes += gathers * (dp - 1) * slot * F32
        scatter_calls += 1
        scatter_bytes += (dp - 1) * (slot + len(parameters)) * F32
        partial = [p for p in parameters if p["partial_gradient"]]
        if partial:
            partial_calls += 1
            partial_bytes += all_reduce_sent(slot_numel(partial, tp_rank, dp) * F32, tp)
    loss_bytes = 3 * all_reduce_sent(batch * seq * F32, tp)
    tp_comm = {"all_gather_into": {"calls": 2 * moves + 1,
                                   "bytes_sent": (tp - 1) * (2 * moves * slice_bytes + positions)},
               "reduce_scatter_into": {"calls": 2 * moves, "bytes_sent": (tp - 1) * 2 * moves * slice_bytes},
               "all_reduce": {"calls": 3 + partial_calls, "bytes_sent": loss_bytes + partial_bytes}}
    dp_comm = {}
    if dp > 1:
        dp_comm = {"all_gather_into": {"calls": gather_calls, "bytes_sent": gather_bytes},
                   "reduce_scatter_into": {"calls": scatter_calls, "bytes_sent": scatter_bytes}}
    fsdp_over_tp = {"all_reduce": {"calls": partial_calls, "bytes_sent": partial_bytes}}
    return {"tp": tp_comm, "dp": dp_comm}, fsdp_over_tp, loss_bytes


def sent_only(comm):
    return {kind: {"calls": entry["calls"], "bytes_sent": entry["bytes_sent"]} for kind, entry in comm.items()}


def check_bytes(data):
    for index, rank in enumerate(data["ranks"]):
        groups, over_tp, _ = expected_group_comm(data, rank["tp"])
        actual = {name: sent_only(comm) for name, comm in rank["group_comm"].items()}
        expect(actual == groups, f"rank {index}: the groups counted {actual}, the shapes say {groups}")
        expect(sent_only(rank["fsdp_comm_over_tp"]) == over_tp,
               f"rank {index}: FSDP's sums over tp {rank['fsdp_comm_over_tp']}, expected {over_tp}")
        fsdp = dict(groups["dp"])
        fsdp["all_reduce"] = over_tp["all_reduce"]
        expect(sent_only(rank["fsdp_comm"]) == fsdp, f"rank {index}: FSDP counted {rank['fsdp_comm']}, "
                                                     f"expected {fsdp}")


# ---- trace -------------------------------------------------------------------------------------

def check_trace(data):
    for index, rank in enumerate(data["ranks"]):
        counted = {}
        for group, comm in rank["group_comm"].items():
            for kind, entry in comm.items():
                counted[(group, kind)] = [entry["calls"], entry["bytes_sent"]]
        traced = {}
        for event in data["events"]:
            if event["rank"] == index and event["track"].startswith("comm:"):
                key = (event["track"][len("comm:"):], event["name"])
                traced.setdefault(key, [0, 0])
                traced[key][0] += 1
                traced[key][1] += event["args"]["bytes_sent"]
        expect(traced == counted, f"rank {index}: the trace has {traced} (calls, bytes sent), the groups {counted}")
    for entry in data["time_per_rank"]:
        expected = recomputed_time(data["events"], entry["rank"])
        expect(entry == expected, f"rank {entry['rank']}: time {entry}, recomputed {expected}")


# ---- memory ------------------------------------------------------------------------------------

def check_memory(data):
    dp = data["options"]["dp"]
    parameters = data["parameters"]
    for index, rank in enumerate(data["ranks"]):
        t, d = rank["tp"], rank["dp"]
        shards = sum(ceil_div(p["pieces"][t][0], dp) * row_numel(p["pieces"][t]) for p in parameters) * F32
        real = sum(chunk(p["pieces"][t][0], dp, d) * row_numel(p["pieces"][t]) for p in parameters) * F32
        root = sum(math.prod(p["pieces"][t]) for p in unit_parameters(data, "root")) * F32
        expected = {"start": (0, 0), "loss": (0, root), "grads": (real, 0), "step": (real, 0)}
        stages = [reading["stage"] for reading in rank["memory_bytes"]]
        expect(stages == list(expected), f"rank {index}: stages {stages}")
        for reading in rank["memory_bytes"]:
            where = f"rank {index} at {reading['stage']}"
            gradients, unsharded = expected[reading["stage"]]
            expect(reading["shards"] == shards, f"{where}: shards {reading['shards']}, the pieces' dp rows {shards}")
            expect(reading["optimizer"] == 2 * real + I64 * len(parameters),
                   f"{where}: optimizer state {reading['optimizer']}, expected {2 * real + I64 * len(parameters)}")
            expect(reading["gradients"] == gradients,
                   f"{where}: gradients {reading['gradients']}, expected {gradients}")
            expect(reading["unsharded"] == unsharded, f"{where}: gathered {reading['unsharded']}, expected {unsharded}")
            rest = reading["live"] - shards - reading["optimizer"] - gradients - unsharded
            expect(reading["activations_and_buffers"] == rest and rest >= 0,
                   f"{where}: activations and buffers {reading['activations_and_buffers']}, the rest is {rest}")


# ---- losses ------------------------------------------------------------------------------------

def check_losses(data):
    losses, reference = data["losses"], data["one_rank_losses"]
    expect(len(losses) == len(reference) == data["options"]["steps"], "losses: one per step")
    for step, (mine, want) in enumerate(zip(losses, reference)):
        tolerance = (1e-5 if step == 0 else 1e-4) * max(1.0, abs(want))
        expect(abs(mine - want) <= tolerance, f"step {step + 1}: loss {mine}, one rank {want}")
    expect(data["loss_max_abs_difference_from_one_rank"] == max(abs(a - b) for a, b in zip(losses, reference)),
           "the loss difference is not the losses'")
    if len(losses) >= 10:
        expect(losses[-1] < losses[0] - 1.0, f"the loss did not fall: {losses[0]} -> {losses[-1]}")


# ---- pictures ----------------------------------------------------------------------------------

def check_timeline(data, path):
    figure = data["figures"][os.path.basename(path)]
    expected = []
    for lane in figure["lanes"]:
        for event in data["events"]:
            if event["lane"] == lane:
                expected.append((lane, event["kind"], event["start_us"] / 1000,
                                 (event["start_us"] + event["duration_us"]) / 1000))
    drawn = [(span.get("data-lane"), span.get("data-kind"), float(span.get("data-start")),
              float(span.get("data-end"))) for span in fsdp_check.svg_elements(path, "span")]
    expect(drawn == expected, f"{path}: {len(drawn)} spans drawn, {len(expected)} in the data")
    lanes = {lane.split(" ", 2)[2] for lane in figure["lanes"]}
    expect(lanes == {"compute", "FSDP", "comm:dp", "comm:tp"}, f"{path}: lanes {sorted(lanes)}")


def check_bytes_picture(data, path):
    figure = data["figures"][os.path.basename(path)]
    fsdp_check.check_bars(figure, path)
    for index, rank in enumerate(data["ranks"]):
        tp, dp = rank["group_comm"]["tp"], rank["group_comm"].get("dp", {})
        partial = rank["fsdp_comm_over_tp"]["all_reduce"]["bytes_sent"]
        raw = [tp["all_gather_into"]["bytes_sent"], tp["reduce_scatter_into"]["bytes_sent"],
               tp["all_reduce"]["bytes_sent"] - partial, partial,
               dp.get("all_gather_into", {"bytes_sent": 0})["bytes_sent"],
               dp.get("reduce_scatter_into", {"bytes_sent": 0})["bytes_sent"]]
        plotted = [layer["values"][index] for layer in figure["layers"]]
        expect(plotted == [value / 1024 for value in raw], f"{path}: rank {index} plots {plotted}, sent {raw}")
        _, _, loss_bytes = expected_group_comm(data, rank["tp"])
        expect(raw[2] == loss_bytes, f"{path}: rank {index}'s loss all-reduces {raw[2]}, expected {loss_bytes}")


def check_memory_picture(data, path):
    figure = data["figures"][os.path.basename(path)]
    fsdp_check.check_bars(figure, path)
    keys = ["shards", "optimizer", "gradients", "unsharded", "activations_and_buffers"]
    readings = [(index, reading) for index, rank in enumerate(data["ranks"]) for reading in rank["memory_bytes"]]
    expect(figure["categories"] == [f"rank {index} {reading['stage']}" for index, reading in readings],
           f"{path}: categories")
    for layer, key in zip(figure["layers"], keys):
        expect(layer["values"] == [reading[key] / 1024 for _, reading in readings], f"{path}: {layer['label']}")


def check_loss_picture(data, path):
    figure = data["figures"][os.path.basename(path)]
    lines = fsdp_check.svg_elements(path, "series")
    runs = [data["losses"], data["one_rank_losses"]]
    expect(len(lines) == len(figure["series"]) == 2, f"{path}: {len(lines)} curves")
    for line, series, losses in zip(lines, figure["series"], runs):
        points = [tuple(float(value) for value in pair.split(",")) for pair in line.get("data-points").split()]
        expect(points == list(zip(series["x"], series["y"])), f"{path}: curve {series['label']} is not the data's")
        expect(series["y"] == losses, f"{path}: curve {series['label']} is not its run's losses")


def table_rows(text, header):
    """The rows after the table whose header line starts with `header`, as lists of cells."""
    lines = text[text.index("\n" + header) + 1:].split("\n")
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def number(cell):
    return int(cell.replace(",", ""))


def check_doc(data, path):
    """The page's bytes and memory tables (its default (dp 2, tp 2) run) are this run's numbers."""
    with open(path) as file:
        text = file.read()
    rank0 = data["ranks"][0]
    tp, dp = rank0["group_comm"]["tp"], rank0["group_comm"]["dp"]
    partial = rank0["fsdp_comm_over_tp"]["all_reduce"]
    loss = {"calls": tp["all_reduce"]["calls"] - partial["calls"],
            "bytes_sent": tp["all_reduce"]["bytes_sent"] - partial["bytes_sent"]}
    sent = [tp["all_gather_into"], tp["reduce_scatter_into"], loss, partial, dp["all_gather_into"],
            dp["reduce_scatter_into"]]
    rows = table_rows(text, "| what | group | calls | bytes sent |")
    expect([(number(row[2]), number(row[3])) for row in rows] == [(s["calls"], s["bytes_sent"]) for s in sent],
           f"{path}: the bytes table {rows} is not the run's {sent}")
    total = sum(entry["bytes_sent"] for entry in sent)
    expect(f"{total:,} in all" in text, f"{path}: the total is not the run's {total:,}")
    rows = table_rows(text, "| rank 0 (dp 0, tp 0) |")
    keys = ["shards", "optimizer", "gradients", "unsharded", "activations_and_buffers"]
    for row, key in zip(rows, keys):
        doc = [number(cell) for cell in row[1:]]
        run = [reading[key] for reading in rank0["memory_bytes"]]
        expect(doc == run, f"{path}: rank 0's {key} {doc}, the run's {run}")


def load(path):
    with open(path) as file:
        data = json.load(file)
    data["events"] = [dict(zip(data["event_columns"], row)) for row in data["events"]]
    return data


def check_output(directory, name):
    data = load(os.path.join(directory, name + ".json"))
    picture = lambda suffix: os.path.join(directory, f"{name}_{suffix}.svg")  # noqa: E731
    check_layout(data)
    check_bytes(data)
    check_trace(data)
    check_memory(data)
    check_losses(data)
    check_timeline(data, picture("timeline"))
    check_bytes_picture(data, picture("bytes"))
    check_memory_picture(data, picture("memory"))
    check_loss_picture(data, picture("loss"))
    return data


def check_corruptions(data, page):
    def corrupted(change):
        broken = copy.deepcopy(data)
        change(broken)
        return broken

    def longer_piece(broken):
        broken["parameters"][0]["pieces"][1][0] += 1

    def more_tp_bytes(broken):
        broken["ranks"][1]["group_comm"]["tp"]["all_gather_into"]["bytes_sent"] += F32

    def more_rank0_bytes(broken):
        broken["ranks"][0]["group_comm"]["tp"]["reduce_scatter_into"]["bytes_sent"] += F32

    def lost_event(broken):
        broken["events"].remove(next(e for e in broken["events"] if e["track"] == "comm:tp"))

    def moved_gradient(broken):
        reading = broken["ranks"][3]["memory_bytes"][2]
        reading["gradients"] -= F32
        reading["activations_and_buffers"] += F32

    def drifted_loss(broken):
        broken["losses"][0] += 1e-4

    must_fail("a piece one row longer", lambda: check_layout(corrupted(longer_piece)))
    must_fail("4 more bytes of a tp all-gather", lambda: check_bytes(corrupted(more_tp_bytes)))
    must_fail("a lost tp collective event", lambda: check_trace(corrupted(lost_event)))
    must_fail("4 gradient bytes counted as activations", lambda: check_memory(corrupted(moved_gradient)))
    must_fail("step 1's loss off by 1e-4", lambda: check_losses(corrupted(drifted_loss)))
    must_fail("the page against a run with 4 more activations' bytes on rank 0",
              lambda: check_doc(corrupted(more_rank0_bytes), page))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    runs = [("even", ["--steps", "12"]), ("uneven", ["--steps", "3", "--dp", "3"])]
    page = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "tp_step_by_step.md")
    with tempfile.TemporaryDirectory() as directory:
        results = {}
        for name, flags in runs:
            results[name] = run_and_check(binary, directory, name, flags, check_output)
            print(f"  {name}: layout, bytes, trace, memory, losses and pictures agree")
        try:
            check_doc(results["even"], page)
            print("  the page's tables are the run's numbers")
            check_corruptions(results["even"], page)
        except Mismatch as mismatch:
            sys.exit(str(mismatch))
    print("tp figures: every picture is its run's data")


if __name__ == "__main__":
    main()
