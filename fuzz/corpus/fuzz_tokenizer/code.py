def quantize(x, scale):
    return clamp(x / scale, -448.0, 448.0)
