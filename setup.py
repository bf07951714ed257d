"""meshtf: Mesh-TensorFlow for TensorFlow 2."""
from setuptools import find_packages
from setuptools import setup

setup(
    name="meshtf",
    version="0.1.0",
    description=("Named-dimension model parallelism for TensorFlow 2: "
                 "Mesh-TensorFlow's DSL, layouts and lowering"),
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["meshtf", "meshtf.*"]),
    python_requires=">=3.9",
    install_requires=[
        "tensorflow>=2.16",
        "numpy",
        "absl-py",
        "ml-collections",  # config files (t2t_configs/) and --config.* flags
        "sentencepiece",   # vocabularies for text data
        "tqdm",            # training progress bar
        "matplotlib",      # --mode=plan / sweep pictures (PNG, Agg backend)
    ],
    extras_require={
        # The tests read a TFDS dataset they prepare locally.
        # mesh-tensorflow: Mesh TF 0.1.21's own tests and model library,
        # run on meshtf by tests/compat (it does not import on TF >= 2.16
        # by itself); its tests need gin, scipy and tensorflow-probability
        # (with tf-keras).
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis",
                 "tensorflow-datasets", "importlib_resources",
                 "tensorflow-text",
                 "mesh-tensorflow==0.1.21", "gin-config", "scipy",
                 "tensorflow-probability", "tf-keras"],
        # Reading TFDS datasets from a local data_dir (never downloads);
        # importlib_resources: TFDS 4.9.10's download_and_prepare (tfds
        # build) imports it on Python >= 3.9 without declaring it.
        "tfds": ["tensorflow-datasets", "importlib_resources"],
        # A text task's SavedModel takes and returns strings: its
        # decode_text signature tokenizes with tensorflow-text's
        # SentencePiece ops, so exporting it and serving it need the
        # package (the id signatures need TensorFlow alone).
        "text": ["tensorflow-text"],
        # bench/peers.py's JAX runs (never a test dependency).
        "peers": ["jax[cpu]"],
    },
)
