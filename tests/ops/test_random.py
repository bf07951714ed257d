"""Random ops give the same full tensor on every layout."""
import numpy as np

import harness
import meshtf as mtf

LAYOUTS = [("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;io:cols"),
           ("a:2;b:4", "io:a;batch:b")]


def model(mesh, inputs):
  x = inputs["x"]
  return {
      "u": mtf.random_uniform(mesh, x.shape, -2.0, 3.0, seed=1),
      "n": mtf.random_normal(mesh, "io:16;batch:8", 1.0, 0.5),
      "d": mtf.dropout(x, rate=0.25, seed=7),
  }


def test_random_ops_layout_invariant():
  inputs = {"x": (harness.random_array([8, 16], 0), "batch:8;io:16")}
  runs = harness.assert_layout_invariant(model, inputs, LAYOUTS, wrt=["x"],
                                         rtol=0, atol=0)
  out = next(iter(runs.values())).outputs
  assert -2.0 < out["u"].min() and out["u"].max() < 3.0
  assert len(np.unique(out["u"])) == out["u"].size
  x = inputs["x"][0]
  kept = out["d"] != 0
  np.testing.assert_allclose(out["d"][kept], x[kept] / 0.75, rtol=1e-6)
  assert 0.55 < kept.mean() < 0.95


def test_random_ops_statistics_and_seeds():
  def stats(mesh, inputs):
    return {"n": mtf.random_normal(mesh, "k:100000", 1.0, 0.5, seed=3),
            "n2": mtf.random_normal(mesh, "k:100000", 1.0, 0.5, seed=4)}
  run = harness.run_model(stats, {}, "all:8", "k:all")
  n, n2 = run.outputs["n"], run.outputs["n2"]
  assert abs(n.mean() - 1.0) < 0.01 and abs(n.std() - 0.5) < 0.01
  assert not np.array_equal(n, n2)


def test_random_ops_uneven_layouts():
  """batch:5 / io:7 split unevenly: each processor draws by global index,
  so the padded stripes hold the same numbers as one device, bit for bit."""
  inputs = {"x": (harness.random_array([5, 7], 0), "batch:5;io:7")}

  def uneven(mesh, inputs):
    x = inputs["x"]
    return {"u": mtf.random_uniform(mesh, x.shape, -2.0, 3.0, seed=1),
            "n": mtf.random_normal(mesh, "io:7;batch:5", 1.0, 0.5),
            "d": mtf.dropout(x, rate=0.25, seed=7)}
  harness.assert_layout_invariant(
      uneven, inputs, [("all:8", "io:all"), ("rows:2;cols:4",
                                            "batch:rows;io:cols"),
                       ("rows:2;cols:4", "io:cols+rows"),
                       ("rows:2;cols:4", harness.annotated(
                           "io:cols", {"x": "batch:cols;io:rows"}))],
      wrt=["x"], rtol=0, atol=0)


def test_dropout_mesh_tf_form():
  """Mesh TF's dropout(x, is_training, keep_prob/rate): not training gives
  x; training the same mask as meshtf's form."""
  mesh = mtf.Mesh(mtf.Graph(), "m")
  x = mtf.ones(mesh, "batch:8;io:4")
  assert mtf.dropout(x, False, rate=0.5) is x
  assert mtf.dropout(x, True) is x    # rate 0 by default, as in Mesh TF
  y = mtf.dropout(x, True, 0.75)      # keep_prob positionally
  assert y.shape == x.shape and y is not x


def test_random_ops_of_one_shape_share_one_function_in_the_program():
  """Each dropout is one call op of a shared, not-inlined generator: the
  per-device program does not grow by Threefry's ~120 ops per random op."""
  def build(mesh, x_tf):
    x = mtf.import_tf_tensor(mesh, x_tf, "batch:8;io:16")
    for i in range(4):
      x = mtf.dropout(x, rate=0.1, name="drop%d" % i)
    return mtf.reduce_sum(x)
  impl = mtf.SimdMeshImpl("all:8", "batch:all", harness.DEVICES)
  fn = mtf.MeshFunction(build, impl)
  x = harness.random_array([8, 16], 0)
  fn(x)
  ops = fn.lowering.program.graph.get_operations()
  calls = [op for op in ops
           if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
  assert len(calls) == 4
  assert len({op.get_attr("f").name for op in calls}) == 1
  assert len(ops) < 100
  assert not [op for op in ops if op.type == "BitwiseXor"]
