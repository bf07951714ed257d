"""--mode=sweep (meshtf/train/sweep_mode.py): several (mesh, layout)
candidates of one config planned side by side -- model_dir/sweep.csv and
sweep.png -- invalid entries listed with their reasons while the sweep goes
on; with --sweep_run each entry this process has the devices for trains a
few steps and its measured step time joins the CSV."""
import csv
import io
import json

from meshtf.train import main
from meshtf.train import sweep_mode

TWO_D = "data:4;model:2 @ batch:data;d_ff:model;heads:model;vocab:model"


def _run(*args):
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train", "--config=t2t_configs/lm_tiny.py"]
                          + list(args), out=out, err=err)
  return code, out.getvalue(), err.getvalue()


def _rows(path):
  return list(csv.DictReader(open(path)))


def test_parse_entries():
  entries = sweep_mode.parse_entries(
      "x:8 @ batch:x | x:2;y:4 @ batch:x @ d_model:y\n"
      "x:8 @ batch:x @ @ batch:x\n  x:8  ")
  assert entries[:3] == [
      {"entry": 1, "mesh_shape": "x:8", "layout": "batch:x",
       "variable_layout": "", "activation_layout": ""},
      {"entry": 2, "mesh_shape": "x:2;y:4", "layout": "batch:x",
       "variable_layout": "d_model:y", "activation_layout": ""},
      {"entry": 3, "mesh_shape": "x:8", "layout": "batch:x",
       "variable_layout": "", "activation_layout": "batch:x"}]
  assert entries[3]["problem"] == (
      "'x:8' is not 'mesh_shape @ layout [@ variable_layout [@ "
      "activation_layout]]'")


def test_sweep_plans_every_entry_and_lists_the_invalid(tmp_path):
  sweep = " | ".join(["data:8 @ batch:data", TWO_D, "x:3 @ batch:x;d_ff:x",
                      "data:8 @ batch:data @ d_model:data"])
  code, out, err = _run("--mode=sweep", "--config.sweep=" + sweep,
                        "--model_dir=%s" % tmp_path)
  assert code == 0, err
  assert "layout sweep: 4 entries planned on cpu (3 valid)" in out
  invalid = [l for l in out.splitlines() if l.startswith("invalid entry")]
  assert len(invalid) == 1 and invalid[0].startswith(
      "invalid entry 3 (x:3 @ batch:x;d_ff:x): ") and \
      "would split both dimension 'batch'" in invalid[0]
  rows = _rows(tmp_path / "sweep.csv")
  assert [(r["entry"], r["valid"]) for r in rows] == [
      ("1", "True"), ("2", "True"), ("3", "False"), ("4", "True")]
  assert rows[3]["variable_layout"] == "d_model:data"
  # Weight-update sharding: less memory per device.
  assert float(rows[3]["peak_bytes"]) < float(rows[0]["peak_bytes"])
  assert all(r["measured_step_seconds"] == "" for r in rows)
  with open(tmp_path / "sweep.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # An entry's numbers are --mode=plan's for its mesh and layout.
  code, _, err = _run("--mode=plan", "--mesh_shape=data:4;model:2",
                      "--layout=" + TWO_D.split(" @ ")[1],
                      "--model_dir=%s" % (tmp_path / "plan"))
  assert code == 0, err
  plan = json.load(open(tmp_path / "plan" / "plan.json"))
  assert float(rows[1]["step_seconds"]) == plan["step_seconds"]
  assert int(rows[1]["peak_bytes"]) == \
      plan["memory_bytes_per_device"]["peak"]


def test_sweep_run_measures_what_this_process_can_run(tmp_path):
  code, out, err = _run("--mode=sweep", "--sweep_run",
                        "--config.sweep_steps=3",
                        "--config.sweep=data:8 @ batch:data | data:16 @ "
                        "batch:data", "--model_dir=%s" % tmp_path)
  assert code == 0, err
  rows = _rows(tmp_path / "sweep.csv")
  assert float(rows[0]["measured_step_seconds"]) > 0
  assert rows[0]["run_note"].startswith("median of 2 steps after the first")
  # The tests' process has 8 devices: the 16-processor entry is planned.
  assert rows[1]["measured_step_seconds"] == ""
  assert rows[1]["run_note"] == ("not run: 16 processors, this process has "
                                 "8 devices")
  assert float(rows[1]["step_seconds"]) > 0
  assert "entry 1: measured" in out


def test_bad_sweeps_are_one_line(tmp_path):
  code, out, err = _run("--mode=sweep", "--model_dir=%s" % tmp_path)
  assert code == 2 and not out
  line, = err.splitlines()
  assert "--mode=sweep needs candidates: --config.sweep=" in line
  code, out, err = _run("--mode=sweep", "--config.sweep=x:0 @ batch:x | "
                        "data:8", "--model_dir=%s" % tmp_path)
  assert code == 2 and not out
  line, = err.splitlines()
  assert line.startswith("meshtf.train: error: --mode=sweep: none of the 2 "
                         "entries of config.sweep is valid: #1 ") and \
      "#2 'data:8' is not 'mesh_shape @ layout" in line
  assert list(tmp_path.iterdir()) == []
