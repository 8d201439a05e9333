"""``tfrepro.data.map_with_seed`` and the batch augmentations: the same batches in fresh processes,
new ones each epoch, independent of the parallelism; the negative control is the stateful map."""

import json

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf

from conftest import run_python

_SCRIPT = """
import hashlib, json, sys, warnings
import tfrepro
warnings.simplefilter("ignore")
tfrepro.patch(7)
import tensorflow as tf
import tfrepro.data
from tfrepro.data import map_with_seed, random_brightness, random_flip_left_right, random_translate

images = tf.reshape(tf.range(64 * 8 * 8 * 3, dtype=tf.float32) % 97 / 97.0, [64, 8, 8, 3])
labels = tf.range(64)

def augment(x, y, seed):
    seeds = tf.random.experimental.stateless_split(seed, 3)
    x = random_translate(random_flip_left_right(x, seeds[0]), 2, seeds[1])
    return random_brightness(x, 0.2, seeds[2]), y

def stateful(x, y):
    return tf.image.random_flip_left_right(tf.image.random_brightness(x, 0.2)), y

out = {}
for calls in (1, 4):
    data = map_with_seed(tf.data.Dataset.from_tensor_slices((images, labels)).batch(8), augment, num_parallel_calls=calls)
    out[f"seeded {calls}"] = []
    for epoch in range(3):
        tfrepro.data.set_epoch(epoch)  # as fit does at each epoch's start
        out[f"seeded {calls}"].append(hashlib.sha256(b"".join(x.numpy().tobytes() for x, _ in data)).hexdigest())
if "--control" in sys.argv:
    tfrepro.unpatch()  # the stateful parallel map, without op determinism: thread order decides
    tf.random.set_seed(7)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).repeat(16)  # 1,024 images: room for thread order
    data = data.map(stateful, num_parallel_calls=4, deterministic=False)
    out["stateful"] = hashlib.sha256(b"".join(x.numpy().tobytes() for x, _ in data)).hexdigest()
print(json.dumps(out))
"""


def _run(tmp_path, *args):
    script = tmp_path / "augment.py"
    script.write_text(_SCRIPT)
    proc = run_python(str(script), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fresh_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seeded_maps")
    return [_run(folder, "--control") for _ in range(3)]


@pytest.mark.slow
def test_two_fresh_processes_give_the_same_batches_each_epoch_new_and_any_parallelism(fresh_runs):
    first, second = ({key: run[key] for key in ("seeded 1", "seeded 4")} for run in fresh_runs[:2])
    assert first == second  # byte-identical batches, 3 epochs, in two fresh processes
    epochs = first["seeded 1"]
    assert len(set(epochs)) == 3  # every epoch augments differently
    assert first["seeded 4"] == epochs  # and the result does not depend on num_parallel_calls


@pytest.mark.slow
def test_negative_control_the_stateful_parallel_map_differs_between_runs(fresh_runs):
    digests = {run["stateful"] for run in fresh_runs}
    assert len(digests) > 1, "the stateful parallel map happened to agree in 3 runs"


@pytest.fixture(scope="module")
def tf():
    return _tf.import_tf()


def test_elements_tuples_dicts_and_the_default_seed(tf):
    from tfrepro.data import map_with_seed

    pairs = tf.data.Dataset.from_tensor_slices((tf.zeros([4, 2]), tf.ones([4])))
    seen = list(map_with_seed(pairs, lambda x, y, seed: (x, y, seed), seed=1))
    assert len(seen) == 4 and seen[0][2].shape == (2,) and seen[0][2].dtype == tf.int64
    assert len({tuple(s.numpy()) for _, _, s in seen}) == 4  # one seed per element
    dicts = tf.data.Dataset.from_tensor_slices({"a": tf.zeros([3])})
    assert [float(v) for v in map_with_seed(dicts, lambda d, seed: d["a"] + 1.0, seed=1)] == [1.0, 1.0, 1.0]
    def seeds(fn, **kwargs):
        return [s.numpy().tolist() for s in map_with_seed(dicts, fn, **kwargs)]

    def same(d, seed):
        return seed

    with tfrepro.patched(5):
        a = seeds(same)
    assert a == seeds(same, seed=5)  # the default is the patch seed
    assert seeds(same, seed=5, key="other") != a
    first = seeds(lambda d, seed: seed, seed=5)
    second = seeds(lambda d, seed: seed, seed=5)  # another lambda, another line: another stream
    assert first != second


@pytest.mark.parametrize("kwargs, error, message", [
    ({"seed": None}, ValueError, "needs a seed"),
    ({"seed": -1}, ValueError, "seed must be an int"),
    ({"seed": 1, "num_parallel_calls": 0}, ValueError, "num_parallel_calls"),
    ({"seed": 1, "block": 0}, ValueError, "block must be a positive int"),
])
def test_bad_arguments_say_what_to_do(tf, kwargs, error, message):
    from tfrepro.data import map_with_seed

    with pytest.raises(error, match=message):
        map_with_seed(tf.data.Dataset.range(3), lambda x, seed: x, **kwargs)
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        map_with_seed([1, 2], lambda x, seed: x, seed=1)


def _augment(tf, traced):
    def augment(image, label, seed):  # the tutorials' per-image shape, with TF's stateless image ops
        traced.append(1)
        seeds = tf.random.experimental.stateless_split(seed, 3)
        image = tf.image.stateless_random_flip_left_right(image, seeds[0])
        image = tf.image.stateless_random_crop(tf.image.pad_to_bounding_box(image, 2, 2, 12, 12), [8, 8, 3], seeds[1])
        return {"image": tf.image.stateless_random_brightness(image, 0.1, seeds[2]), "label": (label, label * 2)}

    return augment


def _pairs(tf, count):
    images = tf.random.stateless_uniform([count, 8, 8, 3], [1, 2])
    return tf.data.Dataset.from_tensor_slices((images, tf.range(count)))


def _bits(dataset, tf):
    return [leaf.numpy().tobytes() for element in dataset for leaf in tf.nest.flatten(element)]


@pytest.mark.parametrize("pipeline, size", [("16 elements", 8), ("21 elements (blocks of 7)", 7),
                                            ("length unknown (a short last block)", 8), ("interleaved, 3 files", 8),
                                            ("endless", 8), ("repeated, ending (TF says infinite)", 8)])
def test_blocks_of_elements_give_the_bits_of_one_element_per_call(tf, pipeline, size):
    """Small static-shaped elements go through the map up to 8 per call (fn traced once per element
    of a block); each element's result is the same bits as with one element per call."""
    from tfrepro.data import map_with_seed

    def build(block, traced):
        augment = _augment(tf, traced)
        if pipeline.startswith("interleaved"):
            return tf.data.Dataset.range(3).interleave(
                lambda file: map_with_seed(_pairs(tf, 16).map(lambda x, y: (x + tf.cast(file, tf.float32), y)),
                                           augment, seed=4, key="aug", block=block, epoch=0), cycle_length=3)
        if pipeline.startswith("repeated"):  # a one-shot generator: repeat() ends at its empty second pass
            rows = iter(_pairs(tf, 13))
            data = tf.data.Dataset.from_generator(lambda: rows, output_signature=_pairs(tf, 1).element_spec).repeat()
            assert data.cardinality() == tf.data.INFINITE_CARDINALITY
        else:
            data = {"16": _pairs(tf, 16), "21": _pairs(tf, 21), "length": _pairs(tf, 30).filter(lambda x, y: y % 3 > 0),
                    "endless": _pairs(tf, 12).repeat()}[pipeline.split()[0]]
        mapped = map_with_seed(data, augment, seed=4, key="aug", block=block, epoch=0)  # two pipelines, one epoch
        return mapped.take(40) if pipeline == "endless" else mapped

    blocked, single = [], []
    in_blocks, one_by_one = build(None, blocked), build(1, single)
    assert in_blocks.element_spec == one_by_one.element_spec
    assert tf.get_static_value(in_blocks.cardinality()) == tf.get_static_value(one_by_one.cardinality())
    assert len(blocked) == len(single) + size  # the blocks' function calls fn on each of a block's elements
    first, second = _bits(in_blocks, tf), _bits(one_by_one, tf)
    assert len(first) == len(second) > 0 and first == second


def test_an_error_in_one_element_fails_its_block_and_ignore_errors_goes_on(tf):
    """An element that fails takes its block (of 5, the largest size up to 8 that divides 20) with it,
    and the pass ends (a length check after the blocks would fail at the end and, under
    ignore_errors(), loop); block=1 loses it alone."""
    import threading

    from tfrepro.data import map_with_seed

    def no_fives(value, seed):
        tf.debugging.assert_none_equal(value, 5.0)
        return value + tf.random.stateless_uniform([], seed)

    values = tf.data.Dataset.from_tensor_slices(tf.range(20, dtype=tf.float32))
    counted = {}

    def count(block):
        counted[block] = len(list(map_with_seed(values, no_fives, seed=1, block=block).ignore_errors()))

    for block in (None, 1):
        worker = threading.Thread(target=count, args=(block,), daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), f"block={block}: the pass did not end"
    assert counted == {None: 15, 1: 19}
    assert map_with_seed(values, no_fives, seed=1).cardinality() == 20  # as for one element per call


def test_elements_that_cannot_be_stacked_go_one_per_call(tf):
    from tfrepro.data import map_with_seed

    def crop(image, label, seed):  # a random size: its results cannot be stacked
        traced.append(1)
        return image[:tf.random.stateless_uniform([], seed, 1, 8, tf.int32)], label

    traced = []
    data = map_with_seed(_pairs(tf, 10), crop, seed=1)
    assert len(traced) == 2 and len({image.shape[0] for image, _ in data}) > 1
    large = tf.data.Dataset.from_tensor_slices(tf.zeros([3, 80_000]))  # 320 kB per element
    traced = []
    assert len(list(map_with_seed(large, lambda x, seed: (traced.append(1), x)[1], seed=1))) == 3 and len(traced) == 1
    with pytest.raises(ValueError, match="cannot map in blocks of 4: a result has a component that is not a tensor "
                                         "of static shape.*pass block=1"):
        map_with_seed(_pairs(tf, 10), crop, seed=1, block=4)

    def listed(image, label, seed):  # tf.data stacks a list inside a result into one tensor
        return image, [label, label + 1]

    fallback = map_with_seed(_pairs(tf, 10), listed, seed=1)
    assert _bits(fallback, tf) == _bits(map_with_seed(_pairs(tf, 10), listed, seed=1, block=1), tf)
    with pytest.raises(ValueError, match="cannot map in blocks of 8: its results do not stack"):
        map_with_seed(_pairs(tf, 10), listed, seed=1, block=8)
    with pytest.raises(ValueError, match="no block size from 2 to 8 divides its length, 11"):
        map_with_seed(_pairs(tf, 11), lambda image, label, seed: image, seed=1, block=8)


def test_batch_augmentations_draw_per_image_and_repeat_with_the_seed(tf):
    from tfrepro.data import random_brightness, random_flip_left_right, random_translate

    images = tf.reshape(tf.range(32 * 6 * 6, dtype=tf.float32), [32, 6, 6, 1])
    seed = tf.constant([3, 4], tf.int64)
    flipped = random_flip_left_right(images, seed).numpy()
    mirrored = [np.array_equal(f, i[:, ::-1]) for f, i in zip(flipped, images.numpy())]
    assert 0 < sum(mirrored) < 32  # each image draws its own flip
    assert np.array_equal(flipped, random_flip_left_right(images, seed).numpy())
    shifted = random_translate(images, 2, seed).numpy()
    assert shifted.shape == (32, 6, 6, 1) and len({s.tobytes() for s in shifted - images.numpy()}) > 1
    per_image = random_brightness(tf.zeros_like(images), 0.5, seed).numpy().reshape(32, -1)  # the deltas
    assert np.all(per_image.max(1) == per_image.min(1)) and np.all(np.abs(per_image) <= 0.5)
    assert len(set(per_image[:, 0])) > 1
    assert random_flip_left_right(images[0], seed).shape == (6, 6, 1)  # one image works too
    with pytest.raises(TypeError, match="float images"):
        random_brightness(tf.zeros([2, 2, 2, 1], tf.uint8), 0.1, seed)
    with pytest.raises(ValueError, match="pad must be"):
        random_translate(images, -1, seed)


def test_keras3_random_layers_take_no_per_element_seed(keras, tf):
    """What the README says: Keras 3's random layers draw from a SeedGenerator (a variable each call
    updates); their seed is an int or a SeedGenerator, never a tensor, so map_with_seed cannot key them."""
    if _tf.keras_major(keras) < 3:
        pytest.skip("Keras 3 only")
    flip = keras.layers.RandomFlip()
    with pytest.raises(ValueError, match="must be either an integer or an instance of `SeedGenerator`"):
        flip.get_random_transformation(tf.zeros([2, 4, 4, 1]), training=True, seed=tf.constant([1, 2], tf.int64))


def test_the_scan_names_map_with_seed_and_passes_it(tf):
    from tfrepro.data import map_with_seed
    from tfrepro.diagnosis.pipelines import pipeline_findings

    images = tf.data.Dataset.from_tensor_slices(tf.zeros([8, 4, 4, 1]))
    with tfrepro.patched(0):
        stateful = images.map(tf.image.random_flip_left_right, num_parallel_calls=2)
        found = pipeline_findings(stateful)
        assert len(found) == 1 and "tfrepro.data.map_with_seed" in found[0].fix
        seeded = map_with_seed(images, lambda image, seed: tf.image.stateless_random_flip_left_right(image, seed))
        assert pipeline_findings(seeded) == []  # the fix passes the scan
