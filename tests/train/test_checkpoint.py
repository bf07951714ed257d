"""Layout-free, atomic checkpoints (meshtf/train/checkpoint.py)."""
import os

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import optimize
from meshtf.train import checkpoint

X = harness.random_array([8, 4], 0)
Y = harness.random_array([8, 6], 1)


def train_fn(impl, store):
  """A MeshFunction: one Adam step of a 2-layer model (the optimizer's
  slots and the global step are variables too)."""
  def build(mesh, x, y):
    x = mtf.import_tf_tensor(mesh, x, "batch:8;io:4")
    y = mtf.import_tf_tensor(mesh, y, "batch:8;out:6")
    w1 = mtf.get_variable(mesh, "w1", "io:4;hidden:16")
    w2 = mtf.get_variable(mesh, "w2", "hidden:16;out:6")
    h = mtf.relu(mtf.einsum([x, w1], output_shape="batch:8;hidden:16"))
    out = mtf.einsum([h, w2], output_shape="batch:8;out:6")
    loss = mtf.reduce_mean(mtf.square(out - y))
    ws = [w1, w2]
    optimize.AdamWeightDecayOptimizer(
        0.05, bias_correction=True).apply_grads(
        mtf.gradients([loss], ws), ws)
    return loss
  return mtf.MeshFunction(build, impl, variable_store=store)


def run_steps(fn, n):
  return [float(fn(tf.constant(X), tf.constant(Y))) for _ in range(n)]


def all_values(store):
  return {n: store.full_value(n) for n in store.names()}


def trained_store(mesh_shape="all:1", layout="", max_to_keep=3,
                  directory=None):
  """(store, step function, manager of directory) after one step."""
  store = mtf.VariableStore()
  fn = train_fn(harness.make_impl("placement", mesh_shape, layout), store)
  run_steps(fn, 1)
  return store, fn, checkpoint.CheckpointManager(str(directory),
                                                 max_to_keep=max_to_keep)


def test_save_on_one_layout_restore_bit_equal_on_others(tmp_path):
  store = mtf.VariableStore()
  fn = train_fn(harness.make_impl("simd", "rows:2;cols:4",
                                  "batch:rows;hidden:cols"), store)
  run_steps(fn, 2)
  manager = checkpoint.CheckpointManager(str(tmp_path))
  path = manager.save(store, step=2)
  assert os.path.basename(path) == "ckpt-2" and manager.latest() == path
  saved = all_values(store)
  assert len(saved) >= 6  # weights + Adam moments + global step
  expected_next = run_steps(fn, 2)
  for backend, mesh, layout in [("placement", "all:1", ""),
                                ("placement", "all:8", "hidden:all"),
                                ("simd", "rows:2;cols:4", "io:rows;hidden:cols")]:
    new_store = mtf.VariableStore()
    assert manager.restore(new_store) == 2
    fn2 = train_fn(harness.make_impl(backend, mesh, layout), new_store)
    got_next = run_steps(fn2, 2)  # first call creates the variables
    np.testing.assert_allclose(got_next, expected_next, rtol=1e-5)
    restored = mtf.VariableStore()
    manager.restore(restored)
    fn3 = train_fn(harness.make_impl(backend, mesh, layout), restored)
    # Restoring into variables that already exist assigns them slice by slice.
    fn3(tf.constant(X), tf.constant(Y))
    manager.restore(restored)
    for name, value in saved.items():
      np.testing.assert_array_equal(restored.full_value(name), value,
                                    err_msg="%s %s" % (backend, name))


def test_crash_while_saving_keeps_previous_checkpoint(tmp_path, monkeypatch):
  store = mtf.VariableStore()
  fn = train_fn(harness.make_impl("placement", "all:2", "hidden:all"), store)
  run_steps(fn, 1)
  manager = checkpoint.CheckpointManager(str(tmp_path))
  first = manager.save(store, step=1)
  before = all_values(store)
  run_steps(fn, 1)

  def crash(**kwargs):
    raise KeyboardInterrupt("killed while writing")
  monkeypatch.setattr(tf.raw_ops, "SaveV2", crash)
  with pytest.raises(KeyboardInterrupt):
    manager.save(store, step=2)
  assert manager.latest() == first
  assert sorted(os.listdir(str(tmp_path))) == ["checkpoint.json", "ckpt-1"]
  step, values, _ = manager.read()
  assert step == 1
  for name, value in before.items():
    np.testing.assert_array_equal(values[name], value)


def test_keeps_last_n(tmp_path):
  store = mtf.VariableStore()
  fn = train_fn(harness.make_impl("placement", "all:1", ""), store)
  run_steps(fn, 1)
  manager = checkpoint.CheckpointManager(str(tmp_path), max_to_keep=2)
  for step in (10, 20, 30):
    manager.save(store, step)
  assert [s for s, _ in manager.checkpoints()] == [20, 30]
  assert manager.latest().endswith("ckpt-30")
  # Readable by plain TensorFlow.
  reader = tf.train.load_checkpoint(os.path.join(manager.latest(), "variables"))
  assert reader.get_variable_to_shape_map()["w1"] == [4, 16]


def test_a_copied_checkpoint_is_refused_and_rotation_keeps_newer_ones(
    tmp_path):
  """ckpt-10 copied in as ckpt-90 (issue 41): discovery refuses the folder
  whose name and meta.json disagree instead of resuming from step 10; and a
  save at an older step than a checkpoint present never removes the newer
  one (keep 2: ckpt-20 saved beside ckpt-30 removes only ckpt-10)."""
  import shutil
  store, _, manager = trained_store(max_to_keep=3, directory=tmp_path)
  for step in (10, 20, 30):
    manager.save(store, step)
  shutil.copytree(str(tmp_path / "ckpt-10"), str(tmp_path / "ckpt-90"))
  with pytest.raises(checkpoint.MisnamedCheckpointError,
                     match=r"ckpt-90 holds step 10 .*not step 90: it was "
                           r"renamed or copied: resuming from it would train"
                           r" again from step 10 and overwrite ckpt-20, "
                           r"ckpt-30; ckpt-10 exists too: move ckpt-90 out"):
    manager.read_newest_intact()
  shutil.rmtree(str(tmp_path / "ckpt-10"))
  with pytest.raises(checkpoint.MisnamedCheckpointError,
                     match=r"rename it to .*ckpt-10 \(or move it out"):
    manager.read_newest_intact()
  shutil.rmtree(str(tmp_path / "ckpt-90"))
  manager.save(store, 10)
  keep2 = checkpoint.CheckpointManager(str(tmp_path), max_to_keep=2)
  keep2.save(store, 20)   # re-saved, as a run resumed from step 10 would
  assert [s for s, _ in keep2.checkpoints()] == [20, 30]
  keep2.save(store, 15)
  assert [s for s, _ in keep2.checkpoints()] == [15, 20, 30]


def test_restore_into_a_different_model_is_a_clear_error(tmp_path):
  store = mtf.VariableStore()
  fn = train_fn(harness.make_impl("placement", "all:1", ""), store)
  run_steps(fn, 1)
  manager = checkpoint.CheckpointManager(str(tmp_path))
  manager.save(store, 1)
  _, values, _ = manager.read()
  values["w1"] = np.zeros([5, 16], np.float32)
  with pytest.raises(ValueError, match=r"'w1' has shape \[5, 16\].*\[4, 16\]"):
    store.restore_values(values)
  assert checkpoint.CheckpointManager(str(tmp_path / "empty")).restore(
      mtf.VariableStore()) is None


# --- verification, fallback, repair -------------------------------------------
def _bundle_data(path):
  return os.path.join(path, [f for f in os.listdir(path) if ".data-" in f][0])


def _truncate(path):
  with open(_bundle_data(path), "r+b") as f:
    f.truncate(10)


def _overwrite(path):
  with open(_bundle_data(path), "r+b") as f:
    f.seek(8)
    f.write(b"\xff" * 8)


def _write(name, content):
  def damage(path):
    with open(os.path.join(path, name), "wb") as f:
      f.write(content)
  return damage


def _remove(name):
  return lambda path: os.remove(os.path.join(path, name))


@pytest.mark.parametrize("damage,reason", [
    (_truncate, "the variables bundle does not read"),
    (_overwrite, "Checksum does not match"),
    (_write("variables.index", b"garbage" * 9), "not an sstable"),
    (_remove("variables.index"), "the variables bundle does not read"),
    (_write("meta.json", b"{\"step\": 2,"), "meta.json is broken"),
    (_write("meta.json", b"{\"step\": 2}"), "meta.json is broken: 'variables'"),
    (_remove("meta.json"), "meta.json is missing"),
    (_write("meta.json", b"{\"step\": 2, \"variables\": {\"nope\": {\"shape\":"
            b" [1], \"dtype\": \"float32\"}}}"),
     "variable 'nope' is listed in meta.json but not in the bundle"),
])
def test_a_damaged_checkpoint_is_named_and_skipped(damage, reason, tmp_path):
  store, fn, manager = trained_store(max_to_keep=5, directory=tmp_path)
  manager.save(store, 1)
  before = all_values(store)
  run_steps(fn, 1)
  bad = manager.save(store, 2)
  damage(bad)
  found = manager.read_newest_intact()
  assert found.step == 1 and found.path.endswith("ckpt-1")
  assert [p for p, _ in found.damaged] == [bad]
  assert reason in found.damaged[0][1], found.damaged[0][1]
  assert "\n" not in found.damaged[0][1]
  for name, value in before.items():
    np.testing.assert_array_equal(found.values[name], value)
  assert manager.restore(mtf.VariableStore()) == 1   # restore falls back too
  # With no intact one left: one error naming each.
  damage(os.path.join(str(tmp_path), "ckpt-1"))
  with pytest.raises(checkpoint.DamagedCheckpointError) as e:
    manager.read_newest_intact()
  assert "ckpt-2 is damaged (" in str(e.value)
  assert "ckpt-1 is damaged (" in str(e.value)


def test_a_broken_index_falls_back_to_scanning(tmp_path):
  store, _, manager = trained_store(directory=tmp_path)
  manager.save(store, 3)
  for content in ("{broken", '{"latest": "../../etc"}', '["ckpt-3"]'):
    (tmp_path / "checkpoint.json").write_text(content)
    assert manager.latest().endswith("ckpt-3"), content
    assert manager.read_newest_intact().step == 3


def test_non_finite_values_are_never_saved(tmp_path):
  store, fn, manager = trained_store("all:2", "hidden:all",
                                     directory=tmp_path)
  manager.save(store, 1)
  bad_x = X.copy()
  bad_x[0, 0] = np.nan
  fn(tf.constant(bad_x), tf.constant(Y))   # NaN gradients -> NaN weights
  with pytest.raises(checkpoint.NonFiniteError) as e:
    manager.save(store, 2)
  assert e.value.step == 2 and e.value.name in store.names()
  assert "not finite (NaN or Inf) at step 2" in str(e.value)
  assert sorted(os.listdir(str(tmp_path))) == ["checkpoint.json", "ckpt-1"]


def test_leftovers_are_removed_and_damaged_ones_moved_aside(tmp_path):
  store, _, manager = trained_store(directory=tmp_path)
  path = manager.save(store, 5)
  (tmp_path / ".tmp-ckpt-6-xyz").mkdir()
  (tmp_path / ".tmp-ckpt-6-xyz" / "variables.index").write_text("half")
  (tmp_path / "checkpoint.json.tmp-99").write_text("{")
  assert manager.remove_temporary() == [".tmp-ckpt-6-xyz",
                                        "checkpoint.json.tmp-99"]
  assert sorted(os.listdir(str(tmp_path))) == ["checkpoint.json", "ckpt-5"]
  moved = manager.quarantine(path)
  assert os.path.basename(moved) == "damaged-ckpt-5"
  assert manager.checkpoints() == [] and manager.read_newest_intact() is None
  manager.save(store, 5)
  assert os.path.basename(manager.quarantine(path)) == "damaged-ckpt-5.2"


def test_extra_is_saved_in_meta_and_may_be_computed_after_the_gather(
    tmp_path):
  """The input stream's position rides in meta.json: a dict, or a function
  the chief calls once the values are gathered (a multi-worker run's
  chief collects the workers' positions then)."""
  store, _, manager = trained_store(directory=tmp_path)
  calls = []

  def extra():
    calls.append(len(os.listdir(str(tmp_path))))
    return {"input": {"step": 3, "lanes": {"0": [1, 2]}}}
  manager.save(store, 3, extra=extra)
  manager.save(store, 4, extra={"input": {"step": 4}})
  assert len(calls) == 1
  found = checkpoint.CheckpointManager(str(tmp_path)).read_newest_intact()
  assert found.meta["extra"] == {"input": {"step": 4}}
  _, _, meta = manager.verify(str(tmp_path / "ckpt-3"))
  assert meta["extra"]["input"]["lanes"] == {"0": [1, 2]}
