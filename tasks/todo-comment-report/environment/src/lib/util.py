def clamp(x, lo, hi):
    #FIXME(bob) lo > hi is not checked
    return max(lo, min(x, hi))
