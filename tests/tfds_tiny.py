"""Prepare a tiny TensorFlow Datasets dataset with tfds's own builder machinery, without network:
python tests/tfds_tiny.py DATA_DIR NAME VERSION SIDE CLASSES TRAIN TEST (tests/helpers.py's build_tfds runs it).

Images SIDE x SIDE x 1 (uint8) whose class shows as a bright band; a ClassLabel; splits train and test;
supervised_keys (image, label). The class is named NAME, so the dataset is DATA_DIR/NAME/VERSION as tfds lays it out.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

data_dir, name, version, side, classes, train, test = sys.argv[1:8]
side, classes = int(side), int(classes)


class Tiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version(version)

    def _info(self):
        features = {
            "image": tfds.features.Image(shape=(side, side, 1)),
            "label": tfds.features.ClassLabel(num_classes=classes),
        }
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.FeaturesDict(features), supervised_keys=("image", "label")
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(int(train), 0), "test": self._generate_examples(int(test), 1)}

    def _generate_examples(self, n, seed):
        rng = np.random.default_rng(seed)
        band = max(1, side // classes)
        for i in range(n):
            label = i % classes
            image = rng.integers(0, 60, (side, side, 1), dtype=np.uint8)
            image[label * band : (label + 1) * band] += 180
            yield i, {"image": image, "label": label}


Tiny.name = name
builder = Tiny(data_dir=data_dir)
builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
print(builder.data_dir)
