"""A labelled image dataset made offline, and the decode/augment transform for it.

:func:`write_pngs` renders scikit-learn's bundled 8x8 digits (1797 images, no download)
into ``size`` x ``size`` grayscale PNG files, each copy with a random shift, scale jitter
and noise, in ``<root>/<label>/<n>.png`` folders, so ``spark.read.format("binaryFile")``
reads them as raw bytes with the label in the path. :func:`decode` turns a batch's PNG
bytes into float arrays (Pillow; its decoder releases the GIL, so ``transform_threads``
decode in parallel), and :class:`DigitsTransform` is the batch transform a fit runs on
the executors (decode, optional random-shift augmentation, label from the path).
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

SIZE = 28


def _render(digit: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    scale = rng.uniform(0.55, 0.8)
    side = max(8, int(round(size * scale)))
    img = Image.fromarray((digit / 16.0 * 255).astype(np.uint8)).resize((side, side), Image.BILINEAR)
    canvas = np.zeros((size, size), np.float32)
    dx, dy = rng.integers(0, size - side + 1, 2)
    canvas[dy:dy + side, dx:dx + side] = np.asarray(img, np.float32)
    canvas += rng.normal(0, 18, canvas.shape)
    return np.clip(canvas, 0, 255).astype(np.uint8)


def encode_png(pixels: np.ndarray) -> bytes:
    """A grayscale uint8 array as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def write_pngs(root: str, copies: int = 4, size: int = SIZE, seed: int = 0) -> dict[str, Any]:
    """Write ``copies`` randomised renderings of each bundled digit; returns counts and the path."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    n = 0
    for k in range(copies):
        for i, (img, label) in enumerate(zip(digits.images, digits.target)):
            folder = os.path.join(root, str(int(label)))
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{k}_{i}.png"), "wb") as f:
                f.write(encode_png(_render(img, size, rng)))
            n += 1
    return {"root": root, "images": n, "size": size, "classes": 10}


def decode(blobs: Sequence[bytes], size: int = SIZE) -> np.ndarray:
    """PNG/JPEG bytes -> ``(n, size, size, 1)`` float32 in [0, 1]; names the first undecodable row."""
    from PIL import Image, UnidentifiedImageError

    out = np.empty((len(blobs), size, size, 1), np.float32)
    for i, blob in enumerate(blobs):
        try:
            with Image.open(io.BytesIO(blob)) as img:
                a = np.asarray(img.convert("L"), np.float32)
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            head = bytes(blob[:12]) if blob is not None else None
            raise ValueError(f"row {i} of the slice is not a decodable image ({len(blob or b'')} bytes, starting {head!r}): {exc}") from None
        if a.shape != (size, size):
            raise ValueError(f"row {i} of the slice is a {a.shape[1]}x{a.shape[0]} image; expected {size}x{size}")
        out[i, :, :, 0] = a
    out /= 255.0
    return out


_LABEL = re.compile(r"/(\d+)/[^/]+$")


def labels_from_paths(paths: Sequence[str]) -> np.ndarray:
    out = np.empty(len(paths), np.int64)
    for i, p in enumerate(paths):
        m = _LABEL.search(p)
        if m is None:
            raise ValueError(f"no <label>/ folder in path {p!r}")
        out[i] = int(m.group(1))
    return out


def shift(images: np.ndarray, rng: np.random.Generator, max_shift: int = 2) -> np.ndarray:
    """Random translation by up to ``max_shift`` pixels per image (augmentation)."""
    out = np.zeros_like(images)
    h, w = images.shape[1:3]
    for i, (dy, dx) in enumerate(rng.integers(-max_shift, max_shift + 1, (len(images), 2))):
        ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
        xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
        out[i, yd, xd] = images[i, ys, xs]
    return out


@dataclass(frozen=True)
class DigitsTransform:
    """The batch transform: ``content`` (PNG bytes) -> ``image``, ``path`` -> ``label``;
    ``augment`` adds random shifts (seeded by the batch's first path, so reruns agree)."""

    size: int = SIZE
    augment: bool = False

    def __call__(self, cols: Mapping[str, Any]) -> dict[str, np.ndarray]:
        images = decode(cols["content"], self.size)
        paths = cols["path"]
        if self.augment:
            seed = int.from_bytes(str(paths[0]).encode()[-8:].rjust(8, b"\0"), "little")
            images = shift(images, np.random.default_rng(seed))
        return {"image": images, "label": labels_from_paths(paths)}


def cnn(classes: int = 10, size: int = SIZE, seed: int = 0, learning_rate: float = 5e-3) -> Any:
    """A small CNN for the digits (about 30k parameters)."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((size, size, 1), name="image"),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(classes, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
