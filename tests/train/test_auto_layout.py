"""--layout=auto (meshtf/train/auto_layout.py): the binary searches the
layout of the config's model on its mesh before any device exists, prints
the five best, and plans or trains with the best; bad input (an unknown
dim to search, a memory cap nothing meets, an unknown hardware model) is
one line, before any TF work."""
import io
import json

from meshtf.train import main

# Three dims keep the search to a few dozen layouts (seconds).
DIMS = "--config.auto_layout_dims=batch,d_ff,heads"


def _run(*args):
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train"] + list(args), out=out, err=err)
  return code, out.getvalue(), err.getvalue()


def test_plan_with_the_layout_it_chose(tmp_path):
  code, out, err = _run("--layout=auto", DIMS, "--mode=plan",
                        "--config.plan_hardware=tpuv3",
                        "--model_dir=%s" % tmp_path)
  assert code == 0, err
  lines = out.splitlines()
  search_line = [l for l in lines if l.startswith("layout search: ")]
  assert len(search_line) == 1 and "over mesh data:4;model:2" in \
      search_line[0] and "on tpuv3" in search_line[0], out
  shown = [l for l in lines if l.startswith("  ") and ". layout " in l]
  assert len(shown) == 5, out
  using = [l for l in lines if l.startswith("using layout ")]
  assert len(using) == 1
  report = json.load(open(tmp_path / "plan.json"))
  choice = report["layout_search"]
  assert using[0].startswith("using layout %s" % choice["layout"])
  # The plan is of the chosen layout, and it is the fastest shown.
  assert report["config"]["layout"] == choice["layout"]
  assert report["layout"] == choice["layout"]
  steps = [c["step_seconds"] for c in choice["candidates"]]
  assert steps == sorted(steps) and len(steps) == 5
  assert report["step_seconds"] == choice["candidates"][0]["step_seconds"]
  # No slower than the default layout's rules for the same dims.
  code, _, err = _run("--layout=batch:data;heads:model;d_ff:model",
                      "--mode=plan", "--config.plan_hardware=tpuv3",
                      "--model_dir=%s" % (tmp_path / "default"))
  assert code == 0, err
  default = json.load(open(tmp_path / "default" / "plan.json"))
  assert report["step_seconds"] <= default["step_seconds"]


def test_train_with_the_layout_it_chose(tmp_path):
  code, out, err = _run("--layout=auto", DIMS, "--train_steps=2",
                        "--config.eval_steps=1",
                        "--model_dir=%s" % tmp_path)
  assert code == 0, err
  chosen = [l for l in out.splitlines() if l.startswith("using layout ")]
  assert len(chosen) == 1, out
  assert "step 2" in out or "step      2" in out or "2/2" in out, out


def test_bad_input_is_one_line(tmp_path):
  code, out, err = _run("--layout=auto", "--config.auto_layout_dims=batch,"
                        "colour", "--mode=plan", "--model_dir=%s" % tmp_path)
  assert code == 2 and not out
  line, = err.splitlines()
  assert "auto_layout_dims names colour, which the model does not have" \
      in line and "d_ff" in line

  code, out, err = _run("--layout=auto", DIMS, "--config.auto_memory_gb="
                        "0.000001", "--mode=plan", "--model_dir=%s" % tmp_path)
  assert code == 2
  line, = err.splitlines()
  assert "no layout of this model on mesh data:4;model:2 fits 1e-06 GB" in \
      line and "auto_memory_gb=-1" in line, line

  code, out, err = _run("--layout=auto", DIMS, "--mode=plan",
                        "--config.plan_hardware=tpu9",
                        "--model_dir=%s" % tmp_path)
  assert code == 2
  line, = err.splitlines()
  assert "plan_hardware='tpu9' is not a hardware model" in line
  assert list(tmp_path.iterdir()) == []
