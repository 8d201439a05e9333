"""TensorFlow's own ops, captured before ``patch(ops=True)`` can rebind the public names, so that
tfrepro's ops never call themselves. Inside ``tfrepro.ops``, call TF's ops that patch rebinds from
here, never by their public names (a test checks): once patched, ``tf.gather`` is tfrepro's."""

import tensorflow as tf

unsorted_segment_sum = tf.math.unsorted_segment_sum
unsorted_segment_max = tf.math.unsorted_segment_max
segment_sum = tf.math.segment_sum
gather = tf.gather
bias_add = tf.nn.bias_add
embedding_lookup = tf.nn.embedding_lookup
sparse_dense_matmul = tf.sparse.sparse_dense_matmul
resize_nearest_neighbor = tf.raw_ops.ResizeNearestNeighbor
crop_and_resize = tf.raw_ops.CropAndResize
reduce_sum = tf.reduce_sum
fused_batch_norm = tf.compat.v1.nn.fused_batch_norm
adjust_contrastv2 = tf.raw_ops.AdjustContrastv2
reduce_mean = tf.reduce_mean
matmul = tf.linalg.matmul
einsum = tf.einsum
convolution = tf.nn.convolution
conv2d = tf.nn.conv2d
conv_transpose = tf.nn.conv_transpose
max_pool = tf.nn.max_pool
avg_pool = tf.nn.avg_pool
stateless_dropout = getattr(tf.nn.experimental, "stateless_dropout", None)  # TF >= 2.9 (the exact tier's)
extract_patches = tf.image.extract_patches
divide = tf.math.divide
divide_no_nan = tf.math.divide_no_nan
sigmoid_cross_entropy_with_logits = tf.nn.sigmoid_cross_entropy_with_logits
tanh = tf.math.tanh
sigmoid = tf.math.sigmoid
silu = tf.nn.silu
gelu = tf.nn.gelu
elu = tf.nn.elu
selu = tf.nn.selu
softplus = tf.math.softplus
exp = tf.math.exp
expm1 = tf.math.expm1
log = tf.math.log
log1p = tf.math.log1p
rsqrt = tf.math.rsqrt
add = tf.math.add
