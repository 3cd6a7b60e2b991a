"""A classifier's confusion matrix at each evaluation, as the image TensorBoard shows (`confusion/val`,
`confusion/test`): a row per true class, a column per predicted class, each cell shaded by the share of
its row (so a class with few images reads as plainly as one with many), with its count written in where
the cell is large enough to hold it."""

from __future__ import annotations

import numpy as np

WHITE, BLUE = np.array([255, 255, 255]), np.array([33, 90, 180])  # a share of 0 and of 1
MAX_SIDE = 300  # pixels across the whole matrix: 10 classes get 30-pixel cells, 100 get 6
CELL_LIMITS = (6, 30)
COUNT_CELL = 26  # the smallest cell a count is written in
LABEL_CELL = 14  # the smallest cell whose row and column get their class number


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """(classes, classes) counts: [true, predicted]; rows whose label is outside [0, classes) are left out."""
    labels, predicted = labels.astype(np.int64), predicted.astype(np.int64)
    keep = (labels >= 0) & (labels < classes) & (predicted >= 0) & (predicted < classes)
    flat = labels[keep] * classes + predicted[keep]
    return np.bincount(flat, minlength=classes * classes).reshape(classes, classes)


def confusion_image(matrix: np.ndarray) -> np.ndarray:
    """The matrix drawn as an (H, W, 3) float image in [0, 1], class numbers along the top and left."""
    from PIL import Image, ImageDraw, ImageFont  # only runs that log a classifier's evaluations draw

    classes = len(matrix)
    cell = int(np.clip(MAX_SIDE // max(classes, 1), *CELL_LIMITS))
    margin = 2 * cell // 3 if cell >= LABEL_CELL else 0
    rows = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, rows, out=np.zeros(matrix.shape), where=rows > 0)
    colours = (WHITE + share[..., None] * (BLUE - WHITE)).round().astype(np.uint8)
    cells = np.repeat(np.repeat(colours, cell, axis=0), cell, axis=1)
    picture = np.full((margin + classes * cell, margin + classes * cell, 3), 255, np.uint8)
    picture[margin:, margin:] = cells
    picture[margin:, margin::cell] = picture[margin::cell, margin:] = 200  # grid lines between the cells
    image = Image.fromarray(picture)
    if margin:
        draw, font = ImageDraw.Draw(image), ImageFont.load_default()
        for k in range(classes):
            middle = margin + k * cell + cell // 2
            draw.text((middle, margin // 2), str(k), fill=(90, 90, 90), font=font, anchor="mm")
            draw.text((margin // 2, middle), str(k), fill=(90, 90, 90), font=font, anchor="mm")
        if cell >= COUNT_CELL:
            for (t, p), count in np.ndenumerate(matrix):
                ink = (255, 255, 255) if share[t, p] > 0.5 else (40, 40, 40)
                draw.text((margin + p * cell + cell // 2, margin + t * cell + cell // 2), _short(int(count)),
                          fill=ink, font=font, anchor="mm")
    return np.asarray(image, np.float32) / 255.0


def _short(count: int) -> str:
    """A count in at most four characters: 987, 9.9k, 12k."""
    if count < 1000:
        return str(count)
    return f"{count / 1000:.1f}k" if count < 10_000 else f"{count // 1000}k"
