"""data=image_folder before TensorFlow: which files, which classes, how many images. A directory of class
sub-folders is listed once here (class names sorted, as tf_keras.utils.image_dataset_from_directory sorts them);
runner.builders.data.image_folder streams the files from this listing. Every problem is a ConfigError naming the key
and the path, found by the pre-flight probe before TensorFlow starts, rather than as a decode error at a step.

Images are the files with an image extension (.png .jpg .jpeg .bmp .gif, any case), found recursively under each
class folder; other files are skipped, as Keras skips them. With data.verify_images (default) each image's first
bytes (and a PNG's last ones) are read to check that it is an image of its kind, not a renamed or cut-off file.
"""

import math
import os
import random
from dataclasses import dataclass

from runner.errors import ConfigError

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")  # what tf.io.decode_image reads (and Keras lists)
CHANNELS = {"rgb": 3, "grayscale": 1, "rgba": 4}
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk every whole PNG ends with


@dataclass
class ImageFolderSource:
    """The listing: (path, class index) pairs per split, class names, and what the model needs."""

    classes: list[str]
    train: list[tuple[str, int]]
    eval: list[tuple[str, int]]
    image_size: tuple[int, int]
    channels: int
    scale: float
    task = "classification"
    streamed = True  # runner.builders.data.pipeline: the source builds its own pipeline

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (*self.image_size, self.channels)

    @property
    def num_outputs(self) -> int:
        return len(self.classes)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def train_records(self) -> int:
        return len(self.train)


def parse_scale(key: str, value) -> float | None:
    """data.scale: a number, a fraction written as text (1/255), or null (None)."""
    if value is None:
        return None
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        num, _, den = value.strip().partition("/")
        try:
            number = float(num) / float(den or 1)
        except (ValueError, ZeroDivisionError):
            pass
    if number is None or not math.isfinite(number) or number == 0:
        raise ConfigError(
            f"{key}={value!r} is not a usable scale; give a number (0.5) or a fraction (1/255) to multiply the "
            "inputs by, other than 0 (null: 1/255 for 8-bit images)."
        )
    return number


def _sniff(path: str) -> str | None:
    """What is wrong with the image file at `path`, or None: its first bytes against its kind's signature."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            if head.startswith(b"\x89PNG\r\n\x1a\n"):
                f.seek(max(0, os.path.getsize(path) - len(PNG_END)))
                return None if f.read() == PNG_END else "a PNG file cut short (no IEND chunk at its end)"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    if head.startswith((b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")):
        return None
    return f"not a PNG, JPEG, GIF or BMP image (it starts with {head[:8]!r})" if head else "empty (0 bytes)"


def list_folder(key: str, directory: str, verify: bool, classes: list[str] | None = None) -> dict[str, list[str]]:
    """{class name: sorted image paths} of a directory of class sub-folders; `classes`: those it must draw from."""
    path = os.path.abspath(os.path.expanduser(directory))
    if not os.path.isdir(path):
        what = "is a file, not a directory" if os.path.exists(path) else "does not exist"
        raise ConfigError(
            f"{key}={directory!r} {what} (looked in {path}). Point it at a directory with one sub-folder of images per "
            "class: DIR/cat/1.png, DIR/dog/2.jpg, ..."
        )
    found = {}
    for name in sorted(os.listdir(path)):
        folder = os.path.join(path, name)
        if name.startswith(".") or not os.path.isdir(folder):
            continue
        images, others = [], 0
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for file in sorted(files):
                if file.lower().endswith(EXTENSIONS):
                    images.append(os.path.join(root, file))
                elif not file.startswith("."):
                    others += 1
        if not images:
            extra = f" (only {others} other file(s))" if others else ""
            raise ConfigError(
                f"{key}={directory!r}: the class folder {name!r} holds no images{extra}; images are files ending in "
                f"{' '.join(EXTENSIONS)}. Add images to it or remove the folder."
            )
        found[name] = images
    if not found:
        loose = [f for f in os.listdir(path) if f.lower().endswith(EXTENSIONS)]
        hint = f" It holds {len(loose)} image(s) directly: move them" if loose else " Put the images"
        raise ConfigError(
            f"{key}={directory!r} has no class sub-folders (looked in {path}).{hint} into one sub-folder per class "
            "(DIR/cat/*.png, DIR/dog/*.png); the folder names are the class names."
        )
    if classes is None and len(found) < 2:
        raise ConfigError(
            f"{key}={directory!r} has one class folder ({next(iter(found))!r}); classification needs two classes or "
            "more: add a sub-folder of images per class."
        )
    if classes is not None:
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise ConfigError(
                f"{key}={directory!r} has class folders that data.train_dir lacks: {', '.join(unknown)}; the eval "
                f"images must belong to the training classes ({', '.join(classes)})."
            )
    if verify:
        for images in found.values():
            for image in images:
                problem = _sniff(image)
                if problem:
                    raise ConfigError(
                        f"{key}: {image} is {problem}. Remove or replace it (or set data.verify_images=false to "
                        "skip this check, and fail at the first batch that holds it)."
                    )
    return found


def _pairs(found: dict[str, list[str]], classes: list[str]) -> list[tuple[str, int]]:
    index = {name: i for i, name in enumerate(classes)}
    return [(path, index[name]) for name, paths in found.items() for path in paths]


def load_source(cfg, verify: bool = True) -> ImageFolderSource:
    """The data node -> the listing, every check done (pure Python: runs before TensorFlow). `verify`: read the
    images' signatures too, as data.verify_images says (the build after the probe does not read them again)."""
    verify = verify and cfg.verify_images
    found = list_folder("data.train_dir", cfg.train_dir, verify)
    classes = list(found)
    train = _pairs(found, classes)
    if cfg.eval_dir is not None:
        evals = _pairs(list_folder("data.eval_dir", cfg.eval_dir, verify, classes), classes)
    else:
        random.Random(cfg.seed).shuffle(train)
        held = max(1, round(len(train) * cfg.eval_fraction))
        if held >= len(train):
            raise ConfigError(
                f"data.train_dir={cfg.train_dir!r} holds {len(train)} image(s): data.eval_fraction={cfg.eval_fraction} "
                "leaves none to train on. Add images or give data.eval_dir."
            )
        train, evals = train[held:], train[:held]
    scale = parse_scale("data.scale", cfg.scale)
    return ImageFolderSource(
        classes,
        train,
        evals,
        (int(cfg.image_size[0]), int(cfg.image_size[1])),
        CHANNELS[cfg.color_mode],
        1 / 255 if scale is None else scale,
    )
