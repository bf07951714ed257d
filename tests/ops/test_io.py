"""Getting values onto a mesh (meshtf/ops/io.py): import_tf_tensor,
import_fully_replicated, constant, zeros, ones, zeros_like, ones_like.

Each created tensor is used next to a split input x [batch:8, hidden:4], so
the values and x's gradient are checked on layouts that split the created
tensor's dims too.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import io

X = "batch:8;hidden:4"
LAYOUTS = [
    ("all:8", "batch:all"),
    ("rows:2;cols:4", "hidden:cols"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
]
ARRAY = harness.random_array([8, 4], 7)
ROW = harness.random_array([4], 8)
PERM = [3, 1, 0, 2, 7, 5, 4, 6]

# name -> (meshtf fn(mesh, x) -> created tensor, TensorFlow value)
CREATED = {
    "zeros": (lambda mesh, x: mtf.zeros(mesh, X), tf.zeros([8, 4])),
    "ones": (lambda mesh, x: mtf.ones(mesh, X), tf.ones([8, 4])),
    "zeros_row": (lambda mesh, x: mtf.zeros(mesh, "hidden:4"), tf.zeros([4])),
    "ones_batch": (lambda mesh, x: mtf.ones(mesh, "batch:8"), tf.ones([8])),
    "constant_scalar": (lambda mesh, x: mtf.constant(mesh, 2.5, X),
                        tf.fill([8, 4], 2.5)),
    "constant_scalar_no_shape": (lambda mesh, x: mtf.constant(mesh, -1.5),
                                 tf.constant(-1.5)),
    "constant_array": (lambda mesh, x: mtf.constant(mesh, ARRAY, X),
                       tf.constant(ARRAY)),
    "constant_array_row": (lambda mesh, x: mtf.constant(mesh, ROW, "hidden:4"),
                           tf.constant(ROW)),
    "constant_list": (lambda mesh, x: mtf.constant(mesh, [1.0, 2.0, 3.0, 4.0],
                                                   "hidden:4"),
                      tf.constant([1.0, 2.0, 3.0, 4.0])),
    "zeros_like": (lambda mesh, x: mtf.zeros_like(x), tf.zeros([8, 4])),
    "ones_like": (lambda mesh, x: mtf.ones_like(x), tf.ones([8, 4])),
    "import_fully_replicated": (
        lambda mesh, x: mtf.import_fully_replicated(mesh, tf.constant(ARRAY), X),
        tf.constant(ARRAY)),
    "import_fully_replicated_scalar": (
        lambda mesh, x: mtf.import_fully_replicated(mesh, tf.constant(3.0), []),
        tf.constant(3.0)),
    "import_fully_replicated_row": (
        lambda mesh, x: mtf.import_fully_replicated(mesh, tf.constant(ROW),
                                                    "hidden:4"),
        tf.constant(ROW)),
    "import_slices": (
        lambda mesh, x: mtf.import_slices(
            mesh, X, lambda begin, size: ARRAY[begin[0]:begin[0] + size[0],
                                               begin[1]:begin[1] + size[1]]),
        tf.constant(ARRAY)),
    "import_slices_row": (
        lambda mesh, x: mtf.import_slices(
            mesh, "hidden:4", lambda begin, size: ROW[begin[0]:begin[0] +
                                                      size[0]]),
        tf.constant(ROW)),
    # A host's rows of a batch, in order or not (all rows: one process).
    "import_rows": (
        lambda mesh, x: mtf.import_rows(mesh, ARRAY[PERM], X, PERM),
        tf.constant(ARRAY)),
    "import_rows_in_order": (
        lambda mesh, x: mtf.import_rows(mesh, tf.constant(ARRAY), X,
                                        range(8)),
        tf.constant(ARRAY)),
    "import_tf_tensor": (
        lambda mesh, x: mtf.import_tf_tensor(mesh, tf.constant(ARRAY),
                                             mtf.Shape([("batch", 8),
                                                        ("hidden", 4)])),
        tf.constant(ARRAY)),
}


def _tf_broadcast_to_x(c):
  c = tf.convert_to_tensor(c)
  if c.shape.rank == 1 and c.shape[0] == 8:
    return c[:, None]
  return c


@pytest.mark.parametrize("name", sorted(CREATED))
def test_created_tensor(name):
  make, value = CREATED[name]
  x = harness.random_array([8, 4], 0)
  def model(mesh, t):
    c = make(mesh, t["x"])
    return {"c": c * 1.0, "y": t["x"] * c + c}
  def reference(t):
    c = _tf_broadcast_to_x(value)
    return {"c": value, "y": t["x"] * c + c}
  harness.assert_layout_invariant(model, {"x": (x, X)}, LAYOUTS, wrt=["x"],
                                  reference=reference)


@pytest.mark.parametrize("dtype", [tf.int32, tf.bool, tf.float64])
def test_created_tensor_dtypes(dtype):
  np_dtype = dtype.as_numpy_dtype
  values = (np.arange(32).reshape([8, 4]) % 3).astype(np_dtype)
  def model(mesh, t):
    out = {"ones": mtf.ones(mesh, X, dtype=dtype),
           "zeros_like": mtf.zeros_like(mtf.constant(mesh, values, X, dtype)),
           "array": mtf.constant(mesh, values, X, dtype=dtype),
           "x": t["x"]}
    if dtype == tf.float64:  # the harness sums outputs of one float dtype
      out["x"] = mtf.cast(t["x"], tf.float64)
    return out
  def reference(t):
    return {"ones": tf.ones([8, 4], dtype), "zeros_like": tf.zeros([8, 4], dtype),
            "array": tf.constant(values), "x": tf.cast(t["x"], tf.float64)
            if dtype == tf.float64 else t["x"]}
  runs = harness.assert_layout_invariant(
      model, {"x": (harness.random_array([8, 4], 1), X)}, LAYOUTS,
      reference=reference)
  for run in runs.values():
    assert run.outputs["ones"].dtype == np_dtype
    assert run.outputs["array"].dtype == np_dtype


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS + [
    ("a:2;b:2;c:2", "batch:a;hidden:c")])
def test_import_gives_each_processor_its_slice(mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, tf.constant(ARRAY), X)
  impl = harness.make_impl("placement", mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  slices = lowering.tensors[x].tensor_list
  sizes = impl.slice_shape(x.shape)
  assert sizes != [8, 4]
  for p, s in enumerate(slices):
    b = impl.slice_begin(x.shape, p)
    np.testing.assert_array_equal(
        s.numpy(), ARRAY[b[0]:b[0] + sizes[0], b[1]:b[1] + sizes[1]])
    got, want = (tf.DeviceSpec.from_string(d) for d in (s.device,
                                                          harness.DEVICES[p]))
    assert (got.device_type, got.device_index) == (want.device_type,
                                                   want.device_index)
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(x).numpy(), ARRAY)


def test_shapes_and_dtypes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, X, dtype=tf.int32)
  assert x.shape == X and x.dtype == tf.int32
  assert mtf.zeros_like(x).dtype == tf.int32
  assert mtf.ones_like(x).shape == X
  assert mtf.constant(mesh, 1.0).shape == []
  assert mtf.import_fully_replicated(mesh, tf.ones([4]), "hidden:4").dtype == \
      tf.float32


# --- errors --------------------------------------------------------------------
def _mesh():
  return mtf.Mesh(mtf.Graph(), "m")


@pytest.mark.parametrize("tf_shape,mtf_shape", [
    ([8, 4], "batch:8;hidden:5"),
    ([8, 4], "batch:8"),
    ([8, 4], "batch:8;hidden:4;io:2"),
    ([4, 8], "batch:8;hidden:4"),
])
def test_import_shape_mismatch(tf_shape, mtf_shape):
  with pytest.raises(ValueError, match="must match dimension by dimension"):
    mtf.import_tf_tensor(_mesh(), tf.zeros(tf_shape), mtf_shape)
  with pytest.raises(ValueError, match="must match dimension by dimension"):
    mtf.import_fully_replicated(_mesh(), tf.zeros(tf_shape), mtf_shape)


def test_import_needs_a_shape():
  with pytest.raises(ValueError, match="needs a meshtf shape"):
    mtf.import_tf_tensor(_mesh(), tf.zeros([8]))


def test_import_error_names_the_op():
  with pytest.raises(ValueError, match=r"import_tf_tensor\(my_input\)"):
    mtf.import_tf_tensor(_mesh(), tf.zeros([8]), "batch:4", name="my_input")


def test_import_slices_calls_slice_fn_once_per_processor_slice():
  calls = []
  def slice_fn(begin, size):
    calls.append((tuple(begin), tuple(size)))
    return ARRAY[begin[0]:begin[0] + size[0], begin[1]:begin[1] + size[1]]
  def model(mesh, inputs):
    return {"y": mtf.import_slices(mesh, X, slice_fn) * 1.0}
  run = harness.run_model(model, {}, "rows:2;cols:4", "batch:rows;hidden:cols",
                          backend="simd")
  np.testing.assert_array_equal(run.outputs["y"], ARRAY)
  assert sorted(set(calls)) == [((b, h), (4, 1)) for b in (0, 4)
                                for h in range(4)]


def test_import_slices_wrong_slice_shape_is_named():
  def model(mesh, inputs):
    return {"y": mtf.import_slices(mesh, X, lambda begin, size: ARRAY,
                                   name="reader")}
  with pytest.raises(ValueError, match="'reader'.*exactly the requested"):
    harness.run_model(model, {}, "all:8", "batch:all")


def test_host_rows_and_import_rows_errors():
  impl = harness.make_impl("simd", "rows:2;cols:4", "batch:rows;hidden:cols")
  assert mtf.host_rows(impl, X) == list(range(8))   # one process: all
  with pytest.raises(ValueError, match=r"import_rows \(feat\): local rows "
                     r"have shape \[3, 4\] but 4 rows of .* need shape "
                     r"\[4, 4\]"):
    mtf.import_rows(_mesh(), ARRAY[:3], X, [0, 1, 2, 3], name="feat")

  def model(mesh, inputs):   # this host holds rows 0..3 only
    return {"y": mtf.import_rows(mesh, ARRAY[:4], X, range(4)) * 1.0}
  with pytest.raises(ValueError, match=r"needs rows 4\.\.7 .* holds only 4 "
                     r"rows \(missing \[4, 5, 6, 7\]\)"):
    harness.run_model(model, {}, "rows:2;cols:4", "batch:rows",
                      backend="simd")


def test_constant_array_shape_mismatch():
  with pytest.raises(ValueError, match="value has shape"):
    mtf.constant(_mesh(), np.zeros([4, 8]), X)


def test_every_exported_io_op_is_tested():
  exported = {n for n in dir(mtf) if getattr(getattr(mtf, n), "__module__",
                                              None) == io.__name__}
  tested = {n for n in CREATED if hasattr(mtf, n)} | {"constant",
                                                        "host_rows"}
  # Mesh TF's class names: covered by test_slicewise.py and tests/compat.
  tested |= {"Constant", "ImportOperation"}
  assert exported and exported - tested == set()


def test_uneven_import_export_slices_and_rows():
  """batch:5 / hidden:3 split unevenly: imports pad the slices (the padding
  is poisoned by the harness), exports cut it; import_slices asks slice_fn
  only for the real positions (never for an empty slice), host_rows lists
  the real rows."""
  x = harness.random_array([5, 3], 9)
  calls = []

  def slice_fn(begin, size):
    calls.append((tuple(begin), tuple(size)))
    return x[begin[0]:begin[0] + size[0], begin[1]:begin[1] + size[1]]

  def model(mesh, inputs):
    return {"imported": inputs["x"] * 2.0,
            "sliced": mtf.import_slices(mesh, "batch:5;hidden:3", slice_fn),
            "constant": mtf.constant(mesh, x, "batch:5;hidden:3") + 0.0,
            "rows": mtf.import_rows(mesh, x, "batch:5;hidden:3",
                                    list(range(5))) * 1.0}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:5;hidden:3")},
      [("rows:2;cols:4", "batch:rows;hidden:cols"), ("all:8", "batch:all"),
       ("rows:2;cols:4", "batch:cols+rows"),
       ("rows:2;cols:4", harness.annotated("batch:rows", {
           "x": "hidden:rows+cols"}))],
      wrt=["x"], reference=lambda t: {"imported": t["x"] * 2.0,
                                      "sliced": x, "constant": x, "rows": x})
  # rows:2;cols:4 -> batch stripes of 3 ([0, 3), [3, 5)), hidden stripes of
  # 1 (hidden:3 over 4: the last column processor holds none).
  assert ((3, 1), (2, 1)) in set(calls) and all(0 not in s for _, s in calls)
  impl = harness.make_impl("simd", "all:8", "batch:all")
  assert mtf.host_rows(impl, "batch:5;hidden:3") == list(range(5))
