"""The colour-change splitter's HSV lookup table is exactly `_hsv_bins`, for every colour."""

import numpy as np

from vfm_core.video import frame_features as ff


def test_bin_lut_is_hsv_bins_for_all_24_bit_colours():
    lut = ff._bin_lut()
    assert lut.shape == (1 << 24,) and lut.dtype == np.uint8
    for r0 in range(0, 256, 64):  # 4 chunks of 64 reds (4M colours each)
        i = np.arange(r0 << 16, (r0 + 64) << 16, dtype=np.int32)
        rgb = np.stack([i >> 16, (i >> 8) & 255, i & 255], axis=-1).astype(np.uint8)
        np.testing.assert_array_equal(lut[i], ff._hsv_bins(rgb))
