"""Shape ops (meshtf/ops/shape_ops.py): reshape, rename_dimension,
replace_dimensions and transpose. Every layout gives the single-device values
and gradients (row-major reshapes, as tf.reshape), and a changed layout costs
the collective the Mesh-TensorFlow paper prescribes:

  split -> unsplit                       allconcat
  unsplit -> split                       local slice, no communication
  dim A -> dim B on the same mesh axis   alltoall
"""
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import shape_ops

MESH = "rows:2;cols:4"


def forward_kinds(model_fn, inputs, mesh_shape, layout):
  """Collective kinds of the forward pass alone (no gradient ops)."""
  run = harness.run_model(model_fn, inputs, mesh_shape, layout)
  return sorted(s["kind"] for s in run.lowering.collective_stats())


def check(model_fn, inputs, reference, cases):
  """cases: [(mesh_shape, layout, expected forward collective kinds)]."""
  harness.assert_layout_invariant(
      model_fn, inputs, [(m, l) for m, l, _ in cases],
      wrt=sorted(n for n, (a, _) in inputs.items()
                 if np.issubdtype(a.dtype, np.floating)),
      reference=reference)
  for mesh_shape, layout, expected in cases:
    assert forward_kinds(model_fn, inputs, mesh_shape, layout) == expected, (
        mesh_shape, layout)


def arr(*shape, seed=0):
  return harness.random_array(list(shape), seed)


# --- reshape -------------------------------------------------------------------
# name -> (input shape, new shape, [(mesh, layout, expected kinds)])
RESHAPES = {
    "split_hidden": (
        "batch:8;hidden:8", "batch:8;heads:2;dkv:4", [
            # hidden split -> heads, dkv unsplit: allconcat.
            (MESH, "batch:rows;hidden:cols", ["allconcat"]),
            ("all:8", "hidden:all", ["allconcat"]),
            # heads newly split: a local slice.
            (MESH, "batch:cols;heads:rows", []),  # batch intact on cols
            ("all:8", "batch:all", []),            # batch intact
            (MESH, "heads:rows;dkv:cols", []),     # both newly split
        ]),
    "merge_heads": (
        "batch:8;heads:2;dkv:4", "batch:8;hidden:8", [
            (MESH, "batch:rows;hidden:cols", []),
            (MESH, "heads:rows;dkv:cols", ["allconcat", "allconcat"]),
            # dkv:cols -> hidden:cols: hidden is no dim of the old shape, so
            # allconcat, then a local slice.
            (MESH, "dkv:cols;hidden:cols", ["allconcat"]),
        ]),
    "alltoall_swap": (
        # s is q under a new name (stride 1, size 4) and r is p, so
        # p:cols -> s:cols splits q and concatenates p: one alltoall.
        "batch:8;p:4;q:4", "batch:8;r:4;s:4", [
            (MESH, "batch:rows;p:cols;s:cols", ["alltoall"]),
            (MESH, "p:cols;s:cols", ["alltoall"]),
            ("a:2;b:4", "batch:a;q:b;r:b", ["alltoall"]),
            (MESH, "batch:rows;p:cols;r:cols", []),   # p == r: intact
        ]),
    "flatten": (
        "batch:8;a:2;b:4", "batch:8;ab:8", [
            (MESH, "batch:rows;b:cols", ["allconcat"]),
            ("all:8", "ab:all", []),
            (MESH, "a:rows;ab:cols", ["allconcat"]),
        ]),
    "regroup_batch": (
        # Nothing intact: batch:8;x:4 -> b1:2;b2:16.
        "batch:8;x:4", "b1:2;b2:16", [
            (MESH, "batch:rows;x:cols", ["allconcat", "allconcat"]),
            (MESH, "b1:rows;b2:cols", []),
            (MESH, "batch:cols;b1:rows", ["allconcat"]),
            ("all:8", "batch:all;b2:all", ["allconcat"]),
        ]),
    "swap_axes_between_dims": (
        # p on rows and q on cols -> r (== p) on cols and s (== q) on rows.
        "p:8;q:8", "r:8;s:8", [
            (MESH, "p:rows;q:cols;r:cols;s:rows",
             ["allconcat", "alltoall"]),
            (MESH, "p:cols;s:cols", ["alltoall"]),
            (MESH, "p:rows;s:cols", ["allconcat"]),
        ]),
}


@pytest.mark.parametrize("name", sorted(RESHAPES))
def test_reshape(name):
  old, new, cases = RESHAPES[name]
  old_shape, new_shape = mtf.convert_to_shape(old), mtf.convert_to_shape(new)
  x = arr(*old_shape.to_integer_list, seed=1)
  check(lambda mesh, t: {"y": mtf.reshape(t["x"], new_shape)},
        {"x": (x, old)},
        lambda t: {"y": tf.reshape(t["x"], new_shape.to_integer_list)}, cases)


def test_reshape_then_compute_on_new_dims():
  """The reshaped tensor's layout is usable by later ops (reduce over heads)."""
  x = arr(8, 8, seed=2)
  def model(mesh, t):
    y = mtf.reshape(t["x"], "batch:8;heads:2;dkv:4")
    return {"y": mtf.reduce_sum(mtf.square(y), reduced_dim=mtf.Dimension(
        "heads", 2))}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:8;hidden:8")},
      [(MESH, "batch:rows;hidden:cols"), (MESH, "heads:rows;dkv:cols"),
       ("all:8", "hidden:all"), (MESH, "hidden:rows;dkv:cols")],
      wrt=["x"], reference=lambda t: {"y": tf.reduce_sum(tf.square(
          tf.reshape(t["x"], [8, 2, 4])), axis=1)})


def _factorizations(n, max_len):
  """Every ordered factorization of n into factors >= 2, at most max_len."""
  if n == 1:
    return [[]]
  out = []
  for f in range(2, n + 1):
    if n % f == 0:
      out += [[f] + rest for rest in _factorizations(n // f, max_len - 1)
              if len(rest) < max_len]
  return out


FACTORIZATIONS_64 = _factorizations(64, 4)
FUZZ_MESHES = ["all:8", "rows:2;cols:4", "rows:4;cols:2", "a:2;b:2;c:2"]


@st.composite
def reshape_problems(draw, factorizations=None, meshes=FUZZ_MESHES,
                     even=True):
  """(old shape, new shape, mesh, layout) with a valid layout for both;
  with even=False the rules may split any dim over any axis (mostly
  unevenly)."""
  factorizations = factorizations or FACTORIZATIONS_64
  old = draw(st.sampled_from(factorizations))
  new = draw(st.sampled_from(factorizations))
  old_names = ["d%d" % i for i in range(len(old))]
  # New names may reuse old ones (at other sizes or places) or be fresh.
  new_names = draw(st.permutations(old_names + ["e%d" % i for i in
                                                range(len(new))]))[:len(new)]
  mesh_text = draw(st.sampled_from(meshes))
  mesh = mtf.convert_to_shape(mesh_text)
  sizes = {}
  for n, size in list(zip(old_names, old)) + list(zip(new_names, new)):
    sizes.setdefault(n, []).append(size)
  choices = [None] + mesh.dimension_names
  if not even:   # a dim over two axes, in either order
    choices += ["%s+%s" % (a, b) for a in mesh.dimension_names
                for b in mesh.dimension_names if a != b]
  rules = {}
  for n in sorted(sizes):
    axis = draw(st.sampled_from(choices))
    if axis is None or (even and any(
        sz % mesh.get_dim_by_name(axis).size for sz in sizes[n])):
      continue
    # A tensor's two dims may not share a mesh axis.
    axes = set(axis.split("+"))
    if not any(n in names and axes & set(rules.get(m, "").split("+"))
               for names in (old_names, new_names) for m in names):
      rules[n] = axis
  assume(rules)
  old_shape = mtf.Shape(list(zip(old_names, old)))
  new_shape = mtf.Shape(list(zip(new_names, new)))
  layout = ";".join("%s:%s" % kv for kv in sorted(rules.items()))
  return old_shape, new_shape, mesh_text, layout


@settings(max_examples=50, deadline=None, derandomize=True)
@given(reshape_problems())
def test_reshape_any_layout(problem):
  """Random reshapes of 64 elements under random layouts: row-major values,
  and a gradient that is the cotangent reshaped back."""
  old_shape, new_shape, mesh, layout = problem
  x = np.arange(64, dtype=np.float32).reshape(old_shape.to_integer_list)
  run = harness.run_model(lambda m, t: {"y": mtf.reshape(t["x"], new_shape)},
                          {"x": (x, old_shape)}, mesh, layout, wrt=["x"])
  np.testing.assert_array_equal(run.outputs["y"],
                                x.reshape(new_shape.to_integer_list))
  cotangent = harness.random_array(new_shape.to_integer_list, 1234)
  np.testing.assert_array_equal(run.grads["x"],
                                cotangent.reshape(old_shape.to_integer_list))


# --- rename_dimension ------------------------------------------------------------
RENAMES = [
    # split -> unsplit: allconcat.
    (MESH, "batch:rows;hidden:cols", ["allconcat"]),
    ("all:8", "hidden:all", ["allconcat"]),
    # unsplit -> split: local slice.
    (MESH, "batch:rows;hidden2:cols", []),
    # both names on the same mesh axis: the dim stays where it is.
    (MESH, "hidden:cols;hidden2:cols", []),
    # from one mesh axis to another: allconcat, then a local slice.
    (MESH, "hidden:rows;hidden2:cols", ["allconcat"]),
]


def test_rename_dimension():
  x = arr(8, 8, seed=3)
  check(lambda mesh, t: {"y": mtf.rename_dimension(t["x"], "hidden",
                                                   "hidden2")},
        {"x": (x, "batch:8;hidden:8")}, lambda t: {"y": t["x"]}, RENAMES)


def test_rename_dimension_of_shape_and_tensor():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, "batch:8;hidden:8")
  assert mtf.rename_dimension(x.shape, "hidden", "h2") == "batch:8;h2:8"
  assert mtf.rename_dimension(x, "batch", "b").shape == "b:8;hidden:8"


def test_rename_then_einsum_against_original():
  """Rename is how a dim meets itself (e.g. a Gram matrix)."""
  x = arr(8, 8, seed=4)
  def model(mesh, t):
    x2 = mtf.rename_dimension(t["x"], "hidden", "hidden2")
    return {"g": mtf.einsum([t["x"], x2], output_shape="hidden:8;hidden2:8")}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:8;hidden:8")},
      [(MESH, "batch:rows;hidden:cols"), ("all:8", "batch:all"),
       (MESH, "hidden:rows;hidden2:cols")],
      wrt=["x"], reference=lambda t: {"g": tf.transpose(t["x"]) @ t["x"]})


# --- replace_dimensions ------------------------------------------------------------
# name -> (input shape, old dims, new dims, [(mesh, layout, expected)])
REPLACES = {
    "one_to_two": (
        "batch:8;hidden:8", ["hidden:8"], ["heads:2", "dkv:4"], [
            (MESH, "batch:rows;hidden:cols", ["allconcat"]),
            (MESH, "batch:rows;dkv:cols", []),
            (MESH, "hidden:cols;dkv:cols", ["allconcat"]),
        ]),
    "two_to_one": (
        "batch:8;heads:2;dkv:4", ["heads:2", "dkv:4"], ["hidden:8"], [
            (MESH, "heads:rows;dkv:cols", ["allconcat", "allconcat"]),
            (MESH, "batch:rows;hidden:cols", []),
            ("all:8", "hidden:all", []),
        ]),
    "two_to_two_alltoall": (
        "batch:8;p:4;q:4", ["p:4", "q:4"], ["r:4", "s:4"], [
            (MESH, "batch:rows;p:cols;s:cols", ["alltoall"]),
            (MESH, "p:cols;s:cols", ["alltoall"]),
            (MESH, "batch:rows;q:cols", ["allconcat"]),
            (MESH, "batch:rows;r:cols", []),
        ]),
    "middle_dim": (
        "a:2;hidden:8;batch:8", ["hidden:8"], ["h1:4", "h2:2"], [
            (MESH, "batch:rows;hidden:cols", ["allconcat"]),
            (MESH, "batch:cols;h2:rows", []),
            ("all:8", "batch:all", []),
        ]),
}


@pytest.mark.parametrize("name", sorted(REPLACES))
def test_replace_dimensions(name):
  old, old_dims, new_dims, cases = REPLACES[name]
  old_shape = mtf.convert_to_shape(old)
  to_dims = lambda ds: [mtf.convert_to_shape(d).dims[0] for d in ds]
  new_shape = mtf.replace_dimensions(old_shape, to_dims(old_dims),
                                     to_dims(new_dims))
  x = arr(*old_shape.to_integer_list, seed=5)
  # A single old dim is passed bare, as Mesh TensorFlow code does.
  old_arg = to_dims(old_dims) if len(old_dims) > 1 else to_dims(old_dims)[0]
  def model(mesh, t):
    y = mtf.replace_dimensions(t["x"], old_arg, to_dims(new_dims))
    assert y.shape == new_shape
    return {"y": y}
  check(model, {"x": (x, old)},
        lambda t: {"y": tf.reshape(t["x"], new_shape.to_integer_list)}, cases)


def test_replace_dimensions_on_shapes():
  s = mtf.convert_to_shape("batch:8;hidden:8;io:4")
  heads, dkv = mtf.Dimension("heads", 2), mtf.Dimension("dkv", 4)
  hidden = mtf.Dimension("hidden", 8)
  assert mtf.replace_dimensions(s, hidden, [heads, dkv]) == \
      "batch:8;heads:2;dkv:4;io:4"
  assert mtf.replace_dimensions(s, [hidden, mtf.Dimension("io", 4)],
                                mtf.Dimension("hio", 32)) == "batch:8;hio:32"


# --- transpose -------------------------------------------------------------------
@pytest.mark.parametrize("perm", [[1, 0, 2], [2, 1, 0], [1, 2, 0], [0, 1, 2]])
def test_transpose(perm):
  old = mtf.convert_to_shape("batch:8;hidden:4;io:2")
  new = mtf.Shape([old.dims[i] for i in perm])
  x = arr(8, 4, 2, seed=6)
  check(lambda mesh, t: {"y": mtf.transpose(t["x"], new) * 1.0},
        {"x": (x, "batch:8;hidden:4;io:2")},
        lambda t: {"y": tf.transpose(t["x"], perm)},
        [("all:8", "batch:all", []),
         (MESH, "hidden:cols;io:rows", []),
         (MESH, "batch:rows;hidden:cols", []),
         ("a:2;b:2;c:2", "batch:a;hidden:b;io:c", [])])


# --- errors ----------------------------------------------------------------------
def _x():
  return mtf.ones(mtf.Mesh(mtf.Graph(), "m"), "batch:8;hidden:8")


def test_reshape_size_mismatch():
  with pytest.raises(ValueError, match="64 elements.*60 elements"):
    mtf.reshape(_x(), "batch:6;hidden:10")


def test_reshape_to_same_shape_is_identity():
  x = _x()
  assert mtf.reshape(x, x.shape) is x
  assert mtf.transpose(x, x.shape) is x


def test_replace_dimensions_errors():
  x = mtf.ones(mtf.Mesh(mtf.Graph(), "m"), "a:2;b:3;c:4")
  a, c = mtf.Dimension("a", 2), mtf.Dimension("c", 4)
  with pytest.raises(ValueError, match="consecutively"):
    mtf.replace_dimensions(x, [a, c], mtf.Dimension("ac", 8))
  with pytest.raises(ValueError, match="consecutively"):
    mtf.replace_dimensions(x, mtf.Dimension("z", 2), mtf.Dimension("y", 2))


def test_transpose_with_other_dims():
  with pytest.raises(ValueError, match="same dims"):
    mtf.transpose(_x(), "hidden:8;io:8")


def test_every_exported_shape_op_is_tested():
  exported = {n for n in dir(mtf) if getattr(getattr(mtf, n), "__module__",
                                              None) == shape_ops.__name__}
  assert exported == {"reshape", "rename_dimension", "replace_dimensions",
                      "transpose", "anonymize", "anonymous_shape",
                      "combined_dimension",
                      "ReshapeOperation"}  # Mesh TF's name: tests/compat


# --- anonymize / anonymous_shape / combined_dimension ------------------------
def test_anonymize_replicates_and_names_back_split_again():
  """anonymize gathers every split dim (the anonymous tensor is replicated);
  reshaping back to the named shape is a local slice."""
  x = arr(8, 4, seed=5)

  def model(mesh, t):
    anon = shape_ops.anonymize(t["x"])
    assert anon.shape == mtf.convert_to_shape("_anonymous_0:8;_anonymous_1:4")
    return {"anon": mtf.square(anon),
            "back": mtf.reshape(anon * 2.0, t["x"].shape)}
  small = "rows:2;cols:2"  # 4 devices: the SPMD runs stay quick
  cases = [("all:2", "batch:all", ["allconcat"]),
           (small, "batch:rows;io:cols", ["allconcat", "allconcat"]),
           (small, "io:rows", ["allconcat"])]
  check(model, {"x": (x, "batch:8;io:4")},
        lambda t: {"anon": tf.square(t["x"]), "back": t["x"] * 2.0}, cases)
  run = harness.run_model(model, {"x": (x, "batch:8;io:4")}, small,
                          "batch:rows;io:cols")
  impl = harness.make_impl("placement", small, "batch:rows;io:cols")
  for op in run.graph.operations:
    for out in op.outputs:
      if out.shape.dims and out.shape.dims[0].name.startswith("_anonymous"):
        assert impl.tensor_layout(out).is_fully_replicated


def test_anonymous_shape_and_combined_dimension():
  assert shape_ops.anonymous_shape("a:2;b:3") == mtf.convert_to_shape(
      "_anonymous_0:2;_anonymous_1:3")
  assert shape_ops.anonymous_shape([]) == mtf.Shape([])
  heads, d_kv = mtf.Dimension("heads", 4), mtf.Dimension("d_kv", 8)
  assert shape_ops.combined_dimension([heads, d_kv]) == mtf.Dimension(
      "heads", 32)
  assert shape_ops.combined_dimension([heads, d_kv], name="hidden") == \
      mtf.Dimension("hidden", 32)
  assert shape_ops.combined_dimension([("x", 3)]) == mtf.Dimension("x", 3)
  with pytest.raises(ValueError, match="combined_dimension: dims is empty"):
    shape_ops.combined_dimension([])


# --- uneven splits -------------------------------------------------------------
FACTORIZATIONS_60 = _factorizations(60, 4)


def _forward_stats(old_shape, new_shape, mesh_shape, layout, backend):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = np.arange(old_shape.size, dtype=np.float32).reshape(
      old_shape.to_integer_list)
  y = mtf.reshape(mtf.import_tf_tensor(mesh, tf.constant(x), old_shape),
                  new_shape)
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
      backend, mesh_shape, layout)}, outputs=[y])
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(y).numpy(),
                                x.reshape(new_shape.to_integer_list))
  return lowering.collective_stats()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(reshape_problems(FACTORIZATIONS_60, FUZZ_MESHES + ["all:7", "a:3;b:2"],
                        even=False),
       st.sampled_from(["placement", "simd"]))
def test_reshape_any_uneven_layout_and_its_plan(problem, backend):
  """Random reshapes of 60 elements under layouts that split unevenly and
  over several axes:
  row-major values and gradients (padding poisoned), and the collectives
  the reshape emits are the MeshLayout's plan, byte for byte."""
  old_shape, new_shape, mesh, layout = problem
  x = np.arange(60, dtype=np.float32).reshape(old_shape.to_integer_list)
  run = harness.run_model(lambda m, t: {"y": mtf.reshape(t["x"], new_shape)},
                          {"x": (x, old_shape)}, mesh, layout, backend,
                          wrt=["x"])
  np.testing.assert_array_equal(run.outputs["y"],
                                x.reshape(new_shape.to_integer_list))
  cotangent = harness.random_array(new_shape.to_integer_list, 1234)
  np.testing.assert_array_equal(run.grads["x"],
                                cotangent.reshape(old_shape.to_integer_list))
  plan = mtf.MeshLayout(mesh, layout).relayout_plan(old_shape, new_shape)
  stats = _forward_stats(old_shape, new_shape, mesh, layout, backend)
  assert [(s["kind"], s["elements_per_device"], s["bytes_per_device"])
          for s in stats for _ in range(s["count"])] == [
              (s.kind, s.elements_per_device, s.bytes_per_device)
              for s in plan.collectives]


def test_uneven_reshape_costs_what_the_plan_says():
  """vocab:250 on 4 processors -> [a:2, v2:125] on the same axis: gather
  (padding cut), local reshape, local split; the bytes are (n-1) x the
  padded slice."""
  old, new = (mtf.convert_to_shape("vocab:250"),
              mtf.convert_to_shape("a:2;v2:125"))
  plan = mtf.MeshLayout("x:4", "vocab:x;v2:x").relayout_plan(old, new)
  assert [s.kind for s in plan.steps] == ["allconcat", "reshape", "allsplit"]
  assert plan.bytes_per_device == 3 * 63 * 4
  for backend in ("placement", "simd"):
    stats = _forward_stats(old, new, "x:4", "vocab:x;v2:x", backend)
    assert [(s["kind"], s["bytes_per_device"]) for s in stats] == [
        ("allconcat", 3 * 63 * 4)]


def test_reshape_of_annotated_and_multi_axis_tensors():
  """The reshape's input laid out apart from the rules (an annotation, a
  dim over two axes): it is relaid as annotated, then reshaped under the
  propagated layout; values and gradients as on one device."""
  x = arr(6, 10, seed=8)

  def model(mesh, t):
    return {"y": mtf.reshape(t["x"], "a:3;b:2;c:10") * 1.0,
            "z": mtf.reshape(t["x"], "batch:6;e:5;f:2") * 1.0}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:6;io:10")},
      [(MESH, "a:rows+cols;f:cols"),
       (MESH, harness.annotated("a:rows", {"x": "io:cols+rows"})),
       (MESH, harness.annotated("e:cols", {"x": "batch:cols;io:rows"}))],
      wrt=["x"], reference=lambda t: {"y": tf.reshape(t["x"], [3, 2, 10]),
                                      "z": tf.reshape(t["x"], [6, 5, 2])})
