"""Slicing ops (meshtf/ops/slicing.py): slice, pad, concat, split, stack,
unstack, shift and halo_exchange. Every layout -- including ones that split
the dim the op works along -- gives the single-device values and gradients,
which match TensorFlow's math and autodiff.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import slicing

MESH = "rows:2;cols:4"


def arr(*shape, seed=0):
  return harness.random_array(list(shape), seed)


def check(model_fn, inputs, reference, layouts):
  return harness.assert_layout_invariant(
      model_fn, inputs, layouts,
      wrt=sorted(n for n, (a, _) in inputs.items()
                 if np.issubdtype(a.dtype, np.floating)),
      reference=reference)


def forward_kinds(model_fn, inputs, mesh_shape, layout):
  run = harness.run_model(model_fn, inputs, mesh_shape, layout)
  return sorted(s["kind"] for s in run.lowering.collective_stats())


# Layouts on batch:4;length:8 (or length:16): split the worked-on dim alone,
# with another dim, or only the other dim.
LENGTH_LAYOUTS = [
    ("all:8", "length:all"),
    (MESH, "batch:rows;length:cols"),
    (MESH, "batch:rows"),
]


# --- slice -------------------------------------------------------------------
def test_slice():
  x = arr(4, 16)

  def model(mesh, t):
    return {"y": slicing.mtf_slice(t["x"], 4, 8, "length")}
  check(model, {"x": (x, "batch:4;length:16")},
        lambda t: {"y": tf.slice(t["x"], [0, 4], [4, 8])}, LENGTH_LAYOUTS)


def test_slice_alias_and_unsplit_dim_is_local():
  def model(mesh, t):
    return {"y": slicing.slice(t["x"], 1, 2, "batch")}
  inputs = {"x": (arr(4, 8), "batch:4;length:8")}
  check(model, inputs, lambda t: {"y": t["x"][1:3]},
        [("all:8", "length:all")])
  assert forward_kinds(model, inputs, "all:8", "length:all") == []


def test_slice_pad_split_to_sizes_the_axis_does_not_divide():
  """The issue's examples: slice to 7, pad to 21, split into 6 + 10 of a
  length split 8 ways (uneven: padded stripes), and back."""
  def model(mesh, t):
    x = t["x"]
    a = slicing.mtf_slice(x, 3, 7, "length")
    b = slicing.pad(a, [4, 10], "length")
    c, d = slicing.split(x, "length", [6, 10])
    return {"a": a, "b": b, "c": c, "d": slicing.concat([d, c], "length")}
  check(model, {"x": (arr(4, 16), "batch:4;length:16")},
        lambda t: {"a": t["x"][:, 3:10],
                   "b": tf.pad(t["x"][:, 3:10], [[0, 0], [4, 10]]),
                   "c": t["x"][:, :6],
                   "d": tf.concat([t["x"][:, 6:], t["x"][:, :6]], 1)},
        [("all:8", "length:all"), ("rows:2;cols:4", "batch:rows;length:cols"),
         ("a:3", "length:a")])


def test_slice_bad_range():
  graph = mtf.Graph()
  x = mtf.ones(mtf.Mesh(graph, "m"), "batch:4;length:8")
  with pytest.raises(ValueError, match="outside"):
    slicing.mtf_slice(x, 6, 4, "length")
  with pytest.raises(ValueError, match="not a dimension"):
    slicing.mtf_slice(x, 0, 4, "nope")


# --- pad ---------------------------------------------------------------------
def test_pad():
  def model(mesh, t):
    return {"y": slicing.pad(t["x"], [3, 5], "length")}
  check(model, {"x": (arr(4, 8), "batch:4;length:8")},
        lambda t: {"y": tf.pad(t["x"], [[0, 0], [3, 5]])}, LENGTH_LAYOUTS)


# --- concat ------------------------------------------------------------------
def test_concat():
  def model(mesh, t):
    return {"y": slicing.concat([t["a"], t["b"], t["c"]], "length")}
  inputs = {"a": (arr(4, 8, seed=1), "batch:4;length:8"),
            "b": (arr(4, 16, seed=2), "batch:4;length:16"),
            "c": (arr(4, 8, seed=3), "batch:4;length:8")}
  check(model, inputs,
        lambda t: {"y": tf.concat([t["a"], t["b"], t["c"]], 1)},
        LENGTH_LAYOUTS)


def test_concat_shape_mismatch():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  with pytest.raises(ValueError, match="same dims"):
    slicing.concat([mtf.ones(mesh, "batch:4;length:8"),
                    mtf.ones(mesh, "batch:2;length:8")], "length")


# --- split -------------------------------------------------------------------
def test_split_sizes():
  def model(mesh, t):
    a, b, c = slicing.split(t["x"], "length", [8, 16, 8])
    return {"a": a, "b": b * 2.0, "c": c}
  check(model, {"x": (arr(4, 32), "batch:4;length:32")},
        lambda t: dict(zip("abc", [
            v * m for v, m in zip(tf.split(t["x"], [8, 16, 8], 1),
                                  [1.0, 2.0, 1.0])])),
        LENGTH_LAYOUTS)


def test_split_equal_with_unused_piece():
  def model(mesh, t):
    pieces = slicing.split(t["x"], mtf.Dimension("length", 16), 2)
    return {"y": pieces[1]}   # pieces[0] gets a zero gradient
  check(model, {"x": (arr(4, 16), "batch:4;length:16")},
        lambda t: {"y": tf.split(t["x"], 2, 1)[1]}, LENGTH_LAYOUTS)


# --- stack / unstack ---------------------------------------------------------
def test_stack():
  def model(mesh, t):
    return {"y": slicing.stack([t["a"], t["b"]], "parts", axis=1)}
  inputs = {"a": (arr(4, 8, seed=1), "batch:4;length:8"),
            "b": (arr(4, 8, seed=2), "batch:4;length:8")}
  check(model, inputs, lambda t: {"y": tf.stack([t["a"], t["b"]], 1)},
        [("all:2", "parts:all"), (MESH, "parts:rows;length:cols"),
         (MESH, "batch:rows;length:cols")])


def test_unstack():
  def model(mesh, t):
    parts = slicing.unstack(t["x"], "parts")
    return {"p%d" % i: p * float(i + 1) for i, p in enumerate(parts)}
  check(model, {"x": (arr(4, 2, 8), "batch:4;parts:2;length:8")},
        lambda t: {"p%d" % i: p * float(i + 1)
                   for i, p in enumerate(tf.unstack(t["x"], axis=1))},
        [("all:2", "parts:all"), (MESH, "parts:rows;length:cols"),
         (MESH, "batch:rows;length:cols")])


# --- shift -------------------------------------------------------------------
def _tf_shift(x, offset, axis, wrap):
  if wrap:
    return tf.roll(x, offset, axis)
  spec = [[0, 0]] * x.shape.rank
  if offset >= 0:
    spec[axis] = [offset, 0]
    return tf.slice(tf.pad(x, spec), [0] * x.shape.rank,
                    x.shape.as_list())
  spec[axis] = [0, -offset]
  begin = [0] * x.shape.rank
  begin[axis] = -offset
  return tf.slice(tf.pad(x, spec), begin, x.shape.as_list())


# Offsets within a stripe, across several stripes, negative, past the end.
@pytest.mark.parametrize("offset,wrap", [
    (1, False), (-3, False), (5, False), (1, True), (-5, True), (18, False),
    (18, True),
])
def test_shift(offset, wrap):
  def model(mesh, t):
    return {"y": slicing.shift(t["x"], offset, "length", wrap)}
  check(model, {"x": (arr(4, 16), "batch:4;length:16")},
        lambda t: {"y": _tf_shift(t["x"], offset, 1, wrap)}, LENGTH_LAYOUTS)


def test_shift_split_dim_uses_permutes_only():
  def model(mesh, t):
    return {"y": slicing.shift(t["x"], 1, "length", False)}
  inputs = {"x": (arr(4, 16), "batch:4;length:16")}
  assert forward_kinds(model, inputs, MESH, "batch:rows;length:cols") == [
      "permute"]
  assert forward_kinds(model, inputs, MESH, "batch:rows") == []


# --- halo_exchange -----------------------------------------------------------
def _tf_halo(x, halo, wrap):
  """x: [blocks, block_size]; each block with halo neighbours each side."""
  flat = tf.reshape(x, [-1])
  n = flat.shape[0]
  block = x.shape[1]
  rows = []
  for b in range(x.shape[0]):
    idx = np.arange(b * block - halo, (b + 1) * block + halo)
    if wrap:
      rows.append(tf.gather(flat, idx % n))
    else:
      ok = (idx >= 0) & (idx < n)
      rows.append(tf.where(ok, tf.gather(flat, np.clip(idx, 0, n - 1)), 0.0))
  return tf.stack(rows)


@pytest.mark.parametrize("halo,wrap", [(2, False), (6, True)])
def test_halo_exchange(halo, wrap):
  def model(mesh, t):
    return {"y": slicing.halo_exchange(t["x"], "blocks", "block", halo, wrap)}
  check(model, {"x": (arr(8, 4), "blocks:8;block:4")},
        lambda t: {"y": _tf_halo(t["x"], halo, wrap)},
        [("all:8", "blocks:all"), (MESH, "blocks:cols;block:rows")])


# --- pool_tensor_1d / stride_tensor_1d ---------------------------------------
POOL_LAYOUTS = [("all:8", "batch:all"), (MESH, "batch:rows;length:cols"),
                ("all:4", "length:all")]


def test_pool_tensor_1d_mean_and_max():
  def model(mesh, t):
    return {"mean": slicing.pool_tensor_1d(t["x"], "length", pool_size=2),
            "max": slicing.pool_tensor_1d(t["x"], "length", mtf.reduce_max,
                                          pool_size=2)}

  def ref(t):
    x = tf.reshape(t["x"], [8, 8, 2])
    return {"mean": tf.reduce_mean(x, 2), "max": tf.reduce_max(x, 2)}
  check(model, {"x": (arr(8, 16), "batch:8;length:16")}, ref, POOL_LAYOUTS)


def test_stride_tensor_1d():
  def model(mesh, t):
    return {"y": slicing.stride_tensor_1d(t["x"], "length", pool_size=2)}
  check(model, {"x": (arr(8, 16), "batch:8;length:16")},
        lambda t: {"y": t["x"][:, ::2]}, POOL_LAYOUTS)


# --- left_halo_exchange ------------------------------------------------------
SMALL = "rows:2;cols:2"  # 4 devices: SPMD runs on 8 cost ~3x more
def test_left_halo_exchange():
  """A halo of a whole block plus part of the one before (6 = 4 + 2)."""
  def model(mesh, t):
    return {"y": slicing.left_halo_exchange(t["x"], "blocks", "block", 6)}
  check(model, {"x": (arr(8, 4), "blocks:8;block:4")},
        lambda t: {"y": _tf_halo(t["x"], 6, False)[:, :10]},
        [("all:4", "blocks:all"), (SMALL, "blocks:cols;block:rows"),
         ("all:2", "blocks:all")])


# --- dynamic_shift -----------------------------------------------------------
def _tf_dynamic_shift(x, offsets, wrap):
  """x [batch, length, d] with row b shifted by offsets[b] along length."""
  return tf.stack([_tf_shift(x[b], int(o), 0, wrap)
                   for b, o in enumerate(offsets)])


def test_dynamic_shift():
  """Per-row offsets within a stripe, negative, across stripes and past the
  end, with and without wrap; offset has a subset of x's dims."""
  offsets = np.array([1, -3, 5, 18], np.int32)

  def model(mesh, t):
    return {"pad": slicing.dynamic_shift(t["x"], t["offset"], "length", False),
            "wrap": slicing.dynamic_shift(t["x"], t["offset"],
                                          mtf.Dimension("length", 8), True)}
  check(model, {"x": (arr(4, 8, 2), "batch:4;length:8;d:2"),
                "offset": (offsets, "batch:4")},
        lambda t: {"pad": _tf_dynamic_shift(t["x"], offsets, False),
                   "wrap": _tf_dynamic_shift(t["x"], offsets, True)},
        [("all:4", "length:all"), (SMALL, "batch:rows;length:cols"),
         (SMALL, "batch:cols;d:rows")])


def test_dynamic_shift_errors():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  x = mtf.ones(mesh, "batch:4;length:8")
  ids = mtf.zeros(mesh, "batch:4", dtype=tf.int32)
  with pytest.raises(TypeError, match="integer"):
    slicing.dynamic_shift(x, mtf.zeros(mesh, "batch:4"), "length", False)
  with pytest.raises(TypeError, match="mtf.shift"):
    slicing.dynamic_shift(x, 2, "length", False)
  with pytest.raises(ValueError, match="may not contain the shifted dim"):
    slicing.dynamic_shift(x, mtf.zeros(mesh, "length:8", dtype=tf.int32),
                          "length", False)
  with pytest.raises(ValueError, match="only dims of x"):
    slicing.dynamic_shift(x, mtf.zeros(mesh, "other:2", dtype=tf.int32),
                          "length", False)
  with pytest.raises(ValueError, match="'depth' is not a dimension"):
    slicing.dynamic_shift(x, ids, "depth", False)


def test_shape_and_slicing_ops_on_uneven_splits():
  """length:10 split 4 or 8 ways (stripes of 3 or 2, padded; some
  processors hold nothing): shift both ways (wrap or not), halo_exchange of
  3 uneven blocks, stack / unstack with an uneven new dim, dynamic_shift,
  pool_tensor_1d, transpose and rename."""
  x = arr(3, 10, seed=5)
  offsets = np.array([2, -4, 11], np.int32)

  def model(mesh, t):
    v = t["x"]
    blocks = mtf.reshape(v, "batch:3;blocks:5;block:2")
    parts = slicing.unstack(slicing.stack([v, v * 2.0, v * 3.0], "parts"),
                            "parts")
    return {
        "right": slicing.shift(v, 3, "length", False),
        "left_wrap": slicing.shift(v, -4, "length", True),
        "halo": slicing.halo_exchange(blocks, "blocks", "block", 1),
        "unstacked": parts[2] - parts[0],
        "dynamic": slicing.dynamic_shift(v, t["offset"], "length", False),
        "pooled": slicing.pool_tensor_1d(v, "length", mtf.reduce_max, 2),
        "transposed": mtf.transpose(v, "length:10;batch:3") * 1.0,
        "renamed": mtf.rename_dimension(v, "length", "other") * 1.0}

  def ref(t):
    v = t["x"]
    padded = tf.pad(tf.reshape(v, [3, 5, 2]), [[0, 0], [1, 1], [0, 0]])
    halo = tf.concat([padded[:, :-2, -1:], padded[:, 1:-1],
                      padded[:, 2:, :1]], axis=2)
    rows = []
    for b in range(3):
      src = np.arange(10) - offsets[b]
      ok = (src >= 0) & (src < 10)
      rows.append(tf.where(ok, tf.gather(v[b], np.clip(src, 0, 9)), 0.0))
    return {"right": _tf_shift(v, 3, 1, False),
            "left_wrap": _tf_shift(v, -4, 1, True), "halo": halo,
            "unstacked": v * 2.0, "dynamic": tf.stack(rows),
            "pooled": tf.reduce_max(tf.reshape(v, [3, 5, 2]), 2),
            "transposed": tf.transpose(v), "renamed": v}
  check(model, {"x": (x, "batch:3;length:10"), "offset": (offsets, "batch:3")},
        ref, [("all:8", "length:all"),
              (MESH, "parts:rows;length:cols;other:rows"),
              ("a:4", "length:a;blocks:a;other:a"),
              (MESH, "length:rows+cols;blocks:cols"),
              (MESH, harness.annotated("length:cols", {
                  "x": "batch:cols;length:rows", "offset": "batch:rows"}))])
