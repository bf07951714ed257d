"""Pooling ops (meshtf/ops/pool.py): shapes, arguments and refused layouts.

The pools' values and gradients go through the layout harness against
TensorFlow in tests/ops/test_conv.py, applied to conv outputs (max_pool2d,
avg_pool2d on split batch, channels, h and w; max_pool3d, avg_pool3d on
split batch, d and channels): one model per harness call keeps the suite
fast.
"""
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import pool


def _lower(build, mesh_shape, layout, shape):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  build(mtf.zeros(mesh, shape))
  mtf.Lowering(graph, {mesh: harness.make_impl("placement", mesh_shape,
                                               layout)})


@pytest.mark.parametrize("build,shape,layout,words", [
    # Stripes of 5 rows, windows of 4: a window would straddle processors.
    (lambda x: pool.max_pool2d(x, (4, 1)), "batch:2;h:10;w:8;c:2", "h:rows",
     ["max_pool2d", "h:10", "'rows'", "stripes of 5", "ksize 4",
      "multiple of 4"]),
    (lambda x: pool.avg_pool3d(x, (1, 3, 1)), "d:2;h:14;w:2;c:2", "h:rows",
     ["avg_pool3d", "h:14", "stripes of 7", "ksize 3"]),
    # An output size that the mesh axis does not divide: the output
    # tensor's own layout check names it.
    (lambda x: pool.avg_pool2d(x, (1, 4)), "batch:2;h:8;w:8;c:2", "w:cols",
     ["avg_pool2d", "'w'", "'cols'"]),
])
def test_refused_layouts_name_op_dim_axis_and_fix(build, shape, layout,
                                                  words):
  with pytest.raises(mtf.LayoutError) as e:
    _lower(build, "rows:2;cols:4", layout, shape)
  for w in words:
    assert w in str(e.value), (w, str(e.value))


def test_shapes_and_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:2;h:7;w:8;c:3")
  # Windows past the last whole one are dropped (VALID), as Mesh TF.
  assert pool.max_pool2d(x, (2, 4)).shape == mtf.convert_to_shape(
      "batch:2;h:3;w:2;c:3")
  assert pool.avg_pool3d(mtf.zeros(mesh, "d:4;h:4;w:4;c:1")).shape == \
      mtf.convert_to_shape("d:2;h:2;w:2;c:1")
  assert pool.max_pool2d(x, (1, 1)) is x
  with pytest.raises(ValueError, match="ksize 16 is larger than spatial dim"):
    pool.max_pool2d(x, (16, 2))
  with pytest.raises(ValueError, match="ksize"):
    pool.max_pool2d(x, (2, 2, 2))
  with pytest.raises(ValueError, match="needs \\[batch..., 3 spatial"):
    pool.max_pool3d(mtf.zeros(mesh, "h:4;w:4;c:1"))
  with pytest.raises(TypeError, match="floating"):
    pool.avg_pool2d(mtf.zeros(mesh, "h:4;w:4;c:1", dtype=tf.int32))
