"""t2t_configs/t5.py: the ten released T5 sizes build meshtf's own
Transformer with the released models' parameter counts (symbolic graphs,
no TF work), computed two ways: from the model meshtf builds, and from the
Mesh TF checkpoint's shapes (shared/embedding, combined heads*d_kv
projections, one [heads, 32] bias per stack, norms, untied logits in
T5.1.1) -- both equal to the released checkpoints' counts.
"""
import os

import pytest
import tensorflow as tf

import meshtf as mtf
from meshtf.models import transformer
from meshtf.train import config as config_lib
from meshtf.train import experiment

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "t2t_configs", "t5.py")

# Parameters of the released checkpoints (T5's and T5.1.1's, as counted
# from their tensors' shapes; the papers round them to 60M ... 11B).
RELEASED = {
    "t5.1.0_small": 60506624, "t5.1.0_base": 222903552,
    "t5.1.0_large": 737668096, "t5.1.0_3B": 2851598336,
    "t5.1.0_11B": 11307321344,
    "t5.1.1_small": 76961152, "t5.1.1_base": 247577856,
    "t5.1.1_large": 783150080, "t5.1.1_xl": 2849757184,
    "t5.1.1_xxl": 11135332352,
}


def _mesh_tf_count(c):
  """Parameters of a Mesh TF T5 checkpoint of config c, from its shapes."""
  d, inner = c.d_model, c.num_heads * c.d_kv
  ffn = (3 if c.gated else 2) * d * c.d_ff   # wi (wi_0, wi_1), wo
  attention = 4 * d * inner                  # q, k, v [d, inner]; o
  bias = c.num_heads * c.relative_attention_num_buckets
  encoder = c.num_layers * (attention + ffn + 2 * d) + bias + d
  decoder = c.num_decoder_layers * (2 * attention + ffn + 3 * d) + bias + d
  embedding = c.vocab_size * d
  logits = 0 if c.shared_embedding_and_softmax_weights else embedding
  return embedding + encoder + decoder + logits


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_parameter_counts_are_the_released_ones(name):
  c = config_lib.load_file(CONFIG, name)
  config_lib.validate(c, check_layout=False, check_data=False)
  model = experiment.build_model(c)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  ids = mtf.zeros(mesh, "batch:2;length:8", dtype=tf.int32)
  transformer.compute_logits_loss_metrics(
      model, {"inputs": ids, "targets": ids})
  count = sum(v.shape.size for v in graph.trainable_variables)
  assert count == _mesh_tf_count(c) == RELEASED[name]
  biases = [v.name for v in graph.trainable_variables
            if v.name.endswith("relative_attention_bias")]
  assert len(biases) == 2   # one table per stack, as released


def test_the_sizes_are_t5s_and_unknown_ones_are_refused():
  small = config_lib.load_file(CONFIG, "t5.1.0_small")
  assert (small.activation, small.gated,
          small.shared_embedding_and_softmax_weights) == ("relu", False, True)
  xxl = config_lib.load_file(CONFIG, "t5.1.1_xxl")
  assert (xxl.activation, xxl.gated, xxl.shared_embedding_and_softmax_weights,
          xxl.d_model, xxl.d_ff) == ("gelu", True, False, 4096, 10240)
  with pytest.raises(ValueError, match="t5.1.1_huge.*t5.1.0_small"):
    config_lib.load_file(CONFIG, "t5.1.1_huge")
