"""Convolution layers (meshtf/models/conv_layers.py) through the harness.

The kernels come from constant initializers, so each single-device run is
checked against TensorFlow (values and input gradients); every layout, on
both backends, must then give the same outputs and input and kernel
gradients. The *_with_blocks layers are compared with TensorFlow's conv of
the whole image assembled from its blocks, on layouts that split the
blocks dims (halo exchange between neighbouring blocks).
"""
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import conv_layers

RA = harness.random_array
# Four-device meshes: SPMD programs launch in about half the time of
# eight-device ones, and 2 x 2 still splits two dims at once.
FOUR = "rows:2;cols:2"
CO, UP = mtf.Dimension("co", 4), mtf.Dimension("up", 2)


def _init(a):
  return mtf.constant_initializer(a)


def test_plain_layers_match_tf():
  x1, x2, x3 = RA([2, 8, 2], 0), RA([2, 8, 8, 2], 1), RA([2, 2, 4, 2, 2], 2)
  k1, k2, k3 = RA([3, 2, 4], 3), RA([3, 3, 2, 4], 4), RA([3, 3, 3, 2, 4], 5)
  t2, t3 = RA([2, 2, 2, 4], 6), RA([2, 2, 2, 2, 4], 7)

  def model(mesh, t):
    y2 = conv_layers.conv2d(t["x2"], CO, strides=(2, 2),
                            filter_initializer=_init(k2))
    y3 = conv_layers.conv3d(t["x3"], CO, filter_initializer=_init(k3))
    return {
        "y1": conv_layers.conv1d(t["x1"], CO, filter_initializer=_init(k1)),
        "y2": y2, "y3": y3,
        "up2": conv_layers.conv2d_transpose(y2, UP,
                                            filter_initializer=_init(t2)),
        "up3": conv_layers.conv3d_transpose(y3, UP,
                                            filter_initializer=_init(t3))}

  def reference(t):
    y2 = tf.nn.conv2d(t["x2"], k2, 2, "SAME")
    y3 = tf.nn.conv3d(t["x3"], k3, [1] * 5, "SAME")
    return {"y1": tf.nn.conv1d(t["x1"], k1, 1, "SAME"), "y2": y2, "y3": y3,
            "up2": tf.nn.conv2d_transpose(y2, t2, [2, 8, 8, 2], 2, "SAME"),
            "up3": tf.nn.conv3d_transpose(y3, t3, [2, 4, 8, 4, 2], 2,
                                          "SAME")}
  harness.assert_layout_invariant(
      model, {"x1": (x1, "batch:2;length:8;ci:2"),
              "x2": (x2, "batch:2;h:8;w:8;ci:2"),
              "x3": (x3, "batch:2;d:2;h:4;w:2;ci:2")},
      [(FOUR, "batch:rows;h:cols"), (FOUR, "ci:rows;length:cols;up:cols"),
       (FOUR, "co:rows;w:cols")],
      wrt=["x1", "x2", "x3"], reference=reference)


# --- blocks ------------------------------------------------------------------
def _image(x, nb):
  """[batch, nb blocks dims, spatial dims, c] -> the whole image [batch,
  spatial, c]: the first nb spatial dims are in blocks."""
  s = x.shape
  nd = len(s) - 2 - nb
  perm = [0] + [a for i in range(nb) for a in (1 + i, 1 + nb + i)]
  perm += [1 + nb + i for i in range(nb, nd)] + [len(s) - 1]
  sizes = [s[1 + i] * s[1 + nb + i] for i in range(nb)]
  sizes += [s[1 + nb + i] for i in range(nb, nd)]
  return tf.reshape(tf.transpose(x, perm), [s[0]] + sizes + [s[-1]])


def _blocks(y, blocks):
  """Inverse of _image: `blocks` blocks along the first spatial dims."""
  s = y.shape
  nb, nd = len(blocks), len(s) - 2
  split = [s[0]]
  for i in range(nb):
    split += [blocks[i], s[1 + i] // blocks[i]]
  y = tf.reshape(y, split + list(s[1 + nb:]))
  perm = [0] + [1 + 2 * i for i in range(nb)] + [2 + 2 * i for i in range(nb)]
  perm += [1 + nb + i for i in range(nb, nd)] + [nb + nd + 1]
  return tf.transpose(y, perm)


# wb:4 on cols:2 puts two blocks on each processor.
BLOCK_LAYOUTS = [(FOUR, "hb:rows;wb:cols"), (FOUR, "db:rows;ci:cols"),
                 (FOUR, "batch:rows;co:cols")]


def test_conv_with_blocks_match_tf_on_the_whole_image():
  # 2D: 3x3 SAME on blocks of 4x2 (both blocks dims split), and an even
  # 4x4 filter with stride 2. 3D: d and h in blocks, w whole (padded).
  x2, k2, k4 = RA([2, 2, 4, 4, 2, 2], 10), RA([3, 3, 2, 4], 11), RA(
      [4, 4, 2, 4], 12)
  x3, k3 = RA([2, 2, 2, 2, 2, 4, 2], 13), RA([3, 3, 3, 2, 4], 14)

  def model(mesh, t):
    x, xx = t["x2"], t["x3"]
    hb, wb = x.shape.dims[1:3]
    db, hb3 = xx.shape.dims[1:3]
    return {
        "y2": conv_layers.conv2d_with_blocks(
            x, CO, h_blocks_dim=hb, w_blocks_dim=wb,
            filter_initializer=_init(k2)),
        "s2": conv_layers.conv2d_with_blocks(
            x, CO, filter_size=(4, 4), strides=(2, 2), h_blocks_dim=hb,
            w_blocks_dim=wb, filter_initializer=_init(k4)),
        "y3": conv_layers.conv3d_with_blocks(
            xx, CO, d_blocks_dim=db, h_blocks_dim=hb3,
            filter_initializer=_init(k3))}

  def reference(t):
    img2, img3 = _image(t["x2"], 2), _image(t["x3"], 2)
    return {
        "y2": _blocks(tf.nn.conv2d(img2, k2, 1, "SAME"), [2, 4]),
        "s2": _blocks(tf.nn.conv2d(img2, k4, 2, "SAME"), [2, 4]),
        "y3": _blocks(tf.nn.conv3d(img3, k3, [1] * 5, "SAME"), [2, 2])}
  runs = harness.assert_layout_invariant(
      model, {"x2": (x2, "batch:2;hb:2;wb:4;h:4;w:2;ci:2"),
              "x3": (x3, "batch:2;db:2;hb:2;d:2;h:2;w:4;ci:2")},
      BLOCK_LAYOUTS, wrt=["x2", "x3"], reference=reference)
  kinds = {s["kind"] for s in runs[("simd",) + BLOCK_LAYOUTS[0]]
           .lowering.collective_stats()}
  assert "permute" in kinds and "allconcat" not in kinds, kinds


def test_conv_transpose_with_blocks_match_tf_on_the_whole_image():
  # 2D: a 4x4 filter, stride 2 (a halo of one input position each way);
  # 3D: 3x3x3, stride 2 (one position before, none after), blocks of 1.
  x2, k2 = RA([2, 2, 4, 2, 2, 2], 20), RA([4, 4, 4, 2], 21)
  x3, k3 = RA([2, 2, 2, 1, 2, 2, 2], 22), RA([3, 3, 3, 4, 2], 23)

  def model(mesh, t):
    x, xx = t["x2"], t["x3"]
    return {
        "y2": conv_layers.conv2d_transpose_with_blocks(
            x, CO, filter_size=(4, 4), h_blocks_dim=x.shape.dims[1],
            w_blocks_dim=x.shape.dims[2], filter_initializer=_init(k2)),
        "y3": conv_layers.conv3d_transpose_with_blocks(
            xx, CO, filter_size=(3, 3, 3), d_blocks_dim=xx.shape.dims[1],
            h_blocks_dim=xx.shape.dims[2], filter_initializer=_init(k3))}

  def reference(t):
    img2, img3 = _image(t["x2"], 2), _image(t["x3"], 2)
    y2 = tf.nn.conv2d_transpose(img2, k2, [2, 8, 16, 4], 2, "SAME")
    y3 = tf.nn.conv3d_transpose(img3, k3, [2, 4, 8, 4, 4], 2, "SAME")
    return {"y2": _blocks(y2, [2, 4]), "y3": _blocks(y3, [2, 2])}
  harness.assert_layout_invariant(
      model, {"x2": (x2, "batch:2;hb:2;wb:4;h:2;w:2;ci:2"),
              "x3": (x3, "batch:2;db:2;hb:2;d:1;h:2;w:2;ci:2")},
      BLOCK_LAYOUTS, wrt=["x2", "x3"], reference=reference)


# --- variables and errors ----------------------------------------------------
def test_variables_shapes_and_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:2;h:8;w:8;ci:3", dtype=tf.bfloat16)
  y = conv_layers.conv2d(x, CO)
  conv_layers.conv2d(y, mtf.Dimension("co2", 5), filter_size=(1, 1),
                     name="proj")
  conv_layers.conv2d_transpose(x, UP)
  conv_layers.conv1d(mtf.zeros(mesh, "batch:2;length:8;ci:3"), CO,
                     filter_size=5)
  names = [v.name for v in graph.trainable_variables]
  assert names == ["conv2d/kernel", "proj/kernel", "conv2d_transpose/kernel",
                   "conv1d/kernel"]
  shapes = [str(v.shape) for v in graph.trainable_variables]
  assert shapes == [str(mtf.convert_to_shape(s)) for s in [
      "fh:3;fw:3;ci:3;co:4", "fh:1;fw:1;co:4;co2:5", "fh:2;fw:2;up:2;ci:3",
      "fw:5;ci:3;co:4"]]
  # float32 master copy, computation in x's dtype (as Mesh TensorFlow).
  assert graph.trainable_variables[0].dtype == tf.float32
  assert y.dtype == tf.bfloat16
  assert conv_layers.max_pool2d(y).shape == mtf.convert_to_shape(
      "batch:2;h:4;w:4;co:4")
  with pytest.raises(ValueError, match="output_dim ci:3 has the name"):
    conv_layers.conv2d(x, mtf.Dimension("ci", 3))
  xb = mtf.zeros(mesh, "batch:2;hb:2;h:4;w:4;ci:3")
  hb = xb.shape.dims[1]
  with pytest.raises(ValueError, match="does not decompose into blocks"):
    conv_layers.conv2d_with_blocks(xb, CO, padding="VALID", h_blocks_dim=hb)
  with pytest.raises(ValueError, match="does not decompose into blocks"):
    conv_layers.conv2d_with_blocks(xb, CO, strides=(3, 1), h_blocks_dim=hb)
  with pytest.raises(ValueError, match="use padding SAME"):
    conv_layers.conv2d_transpose_with_blocks(
        xb, CO, filter_size=(3, 3), padding="VALID", h_blocks_dim=hb)
  with pytest.raises(ValueError, match="blocks dim 'h' must be a dim"):
    conv_layers.conv2d_with_blocks(xb, CO, h_blocks_dim="h")
  # VALID blocks are fine when the filter is no larger than the stride.
  assert conv_layers.conv2d_with_blocks(
      xb, CO, filter_size=(2, 2), strides=(2, 2), padding="VALID",
      h_blocks_dim=hb).shape == mtf.convert_to_shape(
          "batch:2;hb:2;h:2;w:2;co:4")
