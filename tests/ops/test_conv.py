"""Convolution ops (meshtf/ops/conv.py), with the pooling ops
(meshtf/ops/pool.py) in the same models.

Every op runs through the harness against TensorFlow's own op and
GradientTape (input and filter gradients), on layouts that split the batch,
the in and out channels and the spatial dims (halo exchange), on both
backends. Several ops share one model to keep the file fast; the pools are
applied to conv outputs here (their refusals are in test_pool.py). The
refused layouts (windows that would need more than a neighbour's halo) are
checked to raise a LayoutError naming the op, the dim, the mesh axis and
the fix.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import conv
from meshtf.ops import pool

RA = harness.random_array
TWO = "rows:2;cols:4"
# Four-device meshes: a 2 x 2 mesh splits two dims at once, and its SPMD
# programs launch in about half the time of eight-device ones.
FOUR = "rows:2;cols:2"


def _kinds(run):
  return {s["kind"] for s in run.lowering.collective_stats()}


def test_conv2d_same_with_pools():
  # 3x3 SAME conv, then both 2x2 pools. A split h or w is a halo exchange
  # of one row each way (permutes only, no gather of the image).
  x_np, f_np = RA([2, 8, 8, 2], 0), RA([3, 3, 2, 4], 1)

  def model(mesh, t):
    y = conv.conv2d(t["x"], t["f"], [1, 1, 1, 1], "SAME")
    return {"y": y, "max": pool.max_pool2d(y, (2, 2)),
            "avg": pool.avg_pool2d(y, (2, 2))}

  def reference(t):
    y = tf.nn.conv2d(t["x"], t["f"], 1, "SAME")
    return {"y": y, "max": tf.nn.max_pool2d(y, 2, 2, "VALID"),
            "avg": tf.nn.avg_pool2d(y, 2, 2, "VALID")}
  runs = harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:2;h:8;w:8;ci:2"),
              "f": (f_np, "fh:3;fw:3;ci:2;co:4")},
      [(FOUR, "batch:rows;h:cols"), (FOUR, "ci:rows;co:cols"),
       (FOUR, "h:rows;w:cols")],
      wrt=["x", "f"], reference=reference)
  for backend in harness.BACKENDS:
    stats = runs[(backend, FOUR, "batch:rows;h:cols")].lowering \
        .collective_stats()
    assert {s["kind"] for s in stats} == {"permute", "allreduce_sum"}
    # One row each way forward (shared with the filter gradient), and the
    # input gradient's margins back: four permutes, no gather.
    assert sum(s["count"] for s in stats if s["kind"] == "permute") == 4
    # Split in channels: partial sums, one allreduce each way.
    assert _kinds(runs[(backend, FOUR, "ci:rows;co:cols")]) == {
        "allreduce_sum"}


def test_conv2d_strided_valid_even_filters():
  # Stride 2 SAME (3x3), a VALID 2x2/2 patch conv, and an even 4x4 SAME
  # filter (an uneven halo: 1 row before, 2 after). The last layout splits
  # the 4x4 filter's gw dim (gathered before use) on the batch's mesh axis:
  # its gradient is summed over the batch before each keeps its stripe.
  x_np = RA([2, 8, 8, 2], 2)
  f3, f2, f4 = RA([3, 3, 2, 4], 3), RA([2, 2, 2, 4], 4), RA([4, 4, 2, 4], 5)

  def model(mesh, t):
    x = t["x"]
    return {"s2": conv.conv2d(x, t["f3"], [1, 2, 2, 1], "SAME"),
            "patch": conv.conv2d(x, t["f2"], (2, 2), "VALID"),
            "even": conv.conv2d(x, t["f4"], 1, "SAME")}

  def reference(t):
    x = t["x"]
    return {"s2": tf.nn.conv2d(x, t["f3"], 2, "SAME"),
            "patch": tf.nn.conv2d(x, t["f2"], 2, "VALID"),
            "even": tf.nn.conv2d(x, t["f4"], 1, "SAME")}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:2;h:8;w:8;ci:2"),
              "f3": (f3, "fh:3;fw:3;ci:2;co:4"),
              "f2": (f2, "ph:2;pw:2;ci:2;co:4"),
              "f4": (f4, "gh:4;gw:4;ci:2;co:4")},
      [(FOUR, "h:rows;w:cols"), (FOUR, "batch:rows;co:cols"),
       (FOUR, "batch:rows;gw:rows;ci:cols")],
      wrt=["x", "f3", "f2", "f4"], reference=reference)


def test_conv1d_conv3d_and_3d_pools():
  # conv1d with a 7-wide filter on stripes of 2 (all:4): the halo of 3
  # is a whole stripe from the next neighbour and one position from the
  # one after, on each side; x1 has no batch dim. conv3d with 3d pools on
  # split d and channels.
  x1, f1 = RA([8, 2], 6), RA([7, 2, 4], 7)
  x3, f3 = RA([2, 4, 4, 4, 2], 8), RA([3, 3, 3, 2, 4], 9)

  def model(mesh, t):
    y3 = conv.conv3d(t["x3"], t["f3"], [1, 1, 1, 1, 1], "SAME")
    return {"y1": conv.conv1d(t["x1"], t["f1"], 1, "SAME"), "y3": y3,
            "max": pool.max_pool3d(y3, (2, 2, 2)),
            "avg": pool.avg_pool3d(y3, (2, 2, 1))}

  def reference(t):
    y3 = tf.nn.conv3d(t["x3"], t["f3"], [1] * 5, "SAME")
    return {"y1": tf.nn.conv1d(t["x1"][None], t["f1"], 1, "SAME")[0],
            "y3": y3,
            "max": tf.nn.max_pool3d(y3, 2, 2, "VALID"),
            "avg": tf.nn.avg_pool3d(y3, [2, 2, 1], [2, 2, 1], "VALID")}
  harness.assert_layout_invariant(
      model, {"x1": (x1, "length:8;ci:2"),
              "f1": (f1, "k:7;ci:2;co:4"),
              "x3": (x3, "batch:2;d:4;h:4;w:4;ci:2"),
              "f3": (f3, "fd:3;fh:3;fw:3;ci:2;co:4")},
      [("all:4", "length:all"), (FOUR, "batch:rows;d:cols"),
       (FOUR, "ci:rows;co:cols")],
      wrt=["x1", "f1", "x3", "f3"], reference=reference)


def test_conv_transposes():
  # conv2d_transpose (3x3 / 2, SAME and a VALID 2x2 / 2) and
  # conv3d_transpose: the input gradient op of a conv, so a split spatial
  # dim is a halo exchange of the conv's input gradient. x2 has two batch
  # dims.
  x2, f2, g2 = (RA([2, 2, 4, 4, 4], 10), RA([3, 3, 2, 4], 11),
                RA([2, 2, 2, 4], 12))
  x3, f3 = RA([2, 2, 4, 4, 4], 13), RA([3, 3, 3, 2, 4], 14)

  def model(mesh, t):
    return {
        "same": conv.conv2d_transpose(t["x2"], t["f2"], [1, 2, 2, 1], "SAME"),
        "valid": conv.conv2d_transpose(t["x2"], t["g2"], (2, 2), "VALID"),
        "y3": conv.conv3d_transpose(t["x3"], t["f3"], 2, "SAME")}

  def reference(t):
    x2 = tf.reshape(t["x2"], [4, 4, 4, 4])
    up = lambda y: tf.reshape(y, [2, 2, 8, 8, 2])
    return {
        "same": up(tf.nn.conv2d_transpose(x2, t["f2"], [4, 8, 8, 2], 2,
                                          "SAME")),
        "valid": up(tf.nn.conv2d_transpose(x2, t["g2"], [4, 8, 8, 2], 2,
                                           "VALID")),
        "y3": tf.nn.conv3d_transpose(t["x3"], t["f3"], [2, 4, 8, 8, 2], 2,
                                     "SAME")}
  harness.assert_layout_invariant(
      model, {"x2": (x2, "batch:2;t:2;h:4;w:4;ci:4"),
              "f2": (f2, "fh:3;fw:3;co:2;ci:4"),
              "g2": (g2, "gh:2;gw:2;co:2;ci:4"),
              "x3": (x3, "batch:2;d:2;h:4;w:4;ci:4"),
              "f3": (f3, "fd:3;fh:3;fw:3;co:2;ci:4")},
      [(FOUR, "batch:rows;h:cols"), (FOUR, "co:rows;ci:cols"),
       (FOUR, "h:rows;w:cols")],
      wrt=["x2", "f2", "g2", "x3", "f3"], reference=reference)


# --- refused layouts and bad arguments ---------------------------------------
def _lower(build, mesh_shape, layout, shapes_):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  ts = [mtf.zeros(mesh, s) for s in shapes_]
  build(*ts)
  mtf.Lowering(graph, {mesh: harness.make_impl("placement", mesh_shape,
                                               layout)})


X = "batch:2;h:8;w:8;ci:2"
F3 = "fh:3;fw:3;ci:2;co:4"


@pytest.mark.parametrize("build,shapes_,layout,words", [
    # VALID 3x3 on 8 rows: 6 output rows in stripes of 3 against input
    # stripes of 4 -- they drift apart.
    (lambda x, f: conv.conv2d(x, f, 1, "VALID"), [X, F3], "h:rows",
     ["conv2d", "'h'", "'rows'", "VALID", "stripes of 3", "SAME",
      "conv2d_with_blocks"]),
    # Stride 4 SAME on 6 rows: 2 output rows need 8 input rows.
    (lambda x, f: conv.conv2d(x, f, [1, 4, 1, 1], "SAME"),
     ["batch:2;h:6;w:8;ci:2", F3], "h:rows",
     ["conv2d", "'h'", "'rows'", "stride 4", "h:6"]),
    # Stride 3 SAME on 8 rows: 3 output rows need 9 input rows.
    (lambda x, f: conv.conv2d(x, f, 3, "SAME"), [X, F3], "h:cols",
     ["conv2d", "'h'", "'cols'", "stride 3"]),
    # Blocks: the within-block dim must stay whole.
    (lambda x, f: conv.conv2d_with_blocks(x, f, 1, "SAME", h_blocks_dim="hb"),
     ["batch:2;hb:2;h:4;w:8;ci:2", F3], "h:rows",
     ["conv2d_with_blocks", "within-block dim 'h'", "blocks dim 'hb'"]),
    # VALID 4x4 / 2 transposed: 4 rows -> 10, not 8.
    (lambda x, f: conv.conv2d_transpose(x, f, 2, "VALID"),
     ["batch:2;h:4;w:4;ci:2", "fh:4;fw:4;co:4;ci:2"], "h:rows",
     ["conv2d_transpose", "'h'", "VALID", "conv2d_transpose_with_blocks"]),
])
def test_refused_layouts_name_op_dim_axis_and_fix(build, shapes_, layout,
                                                  words):
  with pytest.raises(mtf.LayoutError) as e:
    _lower(build, TWO, layout, shapes_)
  for w in words:
    assert w in str(e.value), (w, str(e.value))


def test_bad_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x, f = mtf.zeros(mesh, X), mtf.zeros(mesh, F3)
  with pytest.raises(ValueError, match="in-channels dim of conv_filter"):
    conv.conv2d(x, mtf.zeros(mesh, "fh:3;fw:3;cj:2;co:4"), 1, "SAME")
  with pytest.raises(ValueError, match="strides"):
    conv.conv2d(x, f, [2, 1, 1, 1], "SAME")
  with pytest.raises(ValueError, match="padding"):
    conv.conv2d(x, f, 1, "FULL")
  with pytest.raises(ValueError, match="larger than spatial dim"):
    conv.conv2d(mtf.zeros(mesh, "b:2;h:2;w:8;ci:2"), f, 1, "VALID")
  with pytest.raises(ValueError, match="filter spatial dim 0"):
    conv.conv2d(x, f, 1, "SAME", filter_h_dim=mtf.Dimension("fw", 3))
  with pytest.raises(ValueError, match="also a dim of conv_input"):
    conv.conv2d(x, mtf.zeros(mesh, "fh:3;fw:3;ci:2;batch:4"), 1, "SAME")
  with pytest.raises(TypeError, match="floating"):
    conv.conv2d(mtf.zeros(mesh, X, dtype=tf.int32), f, 1, "SAME")
  assert conv.conv2d(x, f, [1, 2, 2, 1], "SAME").shape == \
      mtf.convert_to_shape("batch:2;h:4;w:4;co:4")
  assert conv.conv2d_transpose(
      mtf.zeros(mesh, "batch:2;h:4;w:4;co:4"), f, 2, "VALID").shape == \
      mtf.convert_to_shape("batch:2;h:9;w:9;ci:2")
  np.testing.assert_equal(conv.conv_size(8, 4, 1, "SAME"), (8, 1, 2))


def test_conv_and_pool_on_uneven_splits():
  """h:10 over 3 processors (stripes of 4, 2 of padding), channels and
  batch split unevenly: the padding (poisoned by the harness) is zeroed,
  reads as SAME padding past the image end, and never enters a sum. A
  stride-2 conv and a 2x2 pool line up with stripes of 4 -> 2; a 5-wide
  filter's halo of 2 crosses into the padded stripe."""
  x_np = RA([3, 10, 4, 3], 20)
  f3, f5 = RA([3, 3, 3, 5], 21), RA([5, 1, 3, 5], 22)

  def model(mesh, t):
    y = conv.conv2d(t["x"], t["f3"], 1, "SAME")
    return {"y": y, "max": pool.max_pool2d(y, (2, 2)),
            "s2": conv.conv2d(t["x"], t["f3"], [1, 2, 1, 1], "SAME"),
            "wide": conv.conv2d(t["x"], t["f5"], 1, "SAME")}

  def reference(t):
    y = tf.nn.conv2d(t["x"], t["f3"], 1, "SAME")
    return {"y": y, "max": tf.nn.max_pool2d(y, 2, 2, "VALID"),
            "s2": tf.nn.conv2d(t["x"], t["f3"], [1, 2, 1, 1], "SAME"),
            "wide": tf.nn.conv2d(t["x"], t["f5"], 1, "SAME")}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:3;h:10;w:4;ci:3"),
              "f3": (f3, "fh:3;fw:3;ci:3;co:5"),
              "f5": (f5, "gh:5;gw:1;ci:3;co:5")},
      [("a:3", "h:a"), (FOUR, "batch:rows;ci:cols"), ("a:3;b:2", "h:a;co:b"),
       (FOUR, "ci:rows+cols"),
       ("a:3;b:2", harness.annotated("h:a", {"x": "batch:b",
                                             "f3": "co:b+a"}))],
      wrt=["x", "f3", "f5"], reference=reference, rtol=1e-4, atol=1e-4)


def test_conv_transpose_and_blocks_on_uneven_splits():
  """conv2d_transpose (stride 2, SAME) with h:5 -> h:10 split 3 ways
  (stripes of 2 -> 4), and conv2d_with_blocks with 3 blocks of h split 2
  ways (the second processor holds one block and a padded one)."""
  x, f = RA([2, 5, 4, 4], 23), RA([3, 3, 2, 4], 24)
  xb, fb = RA([2, 3, 4, 4, 2], 25), RA([3, 3, 2, 4], 26)

  def model(mesh, t):
    return {"up": conv.conv2d_transpose(t["x"], t["f"], [1, 2, 1, 1], "SAME"),
            "blocks": conv.conv2d_with_blocks(t["xb"], t["fb"], 1, "SAME",
                                              h_blocks_dim="hb")}

  def reference(t):
    image = tf.reshape(t["xb"], [2, 12, 4, 2])
    return {"up": tf.nn.conv2d_transpose(t["x"], t["f"], [2, 10, 4, 2],
                                         [1, 2, 1, 1], "SAME"),
            "blocks": tf.reshape(tf.nn.conv2d(image, t["fb"], 1, "SAME"),
                                 [2, 3, 4, 4, 4])}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:2;h:5;w:4;ci:4"),
              "f": (f, "fh:3;fw:3;co:2;ci:4"),
              "xb": (xb, "batch:2;hb:3;hh:4;ww:4;cj:2"),
              "fb": (fb, "gh:3;gw:3;cj:2;co:4")},
      [("a:3", "h:a;hb:a"), (FOUR, "hb:rows;co:cols")],
      wrt=["x", "f", "xb", "fb"], reference=reference, rtol=1e-4, atol=1e-4)
