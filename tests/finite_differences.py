"""Central finite differences, the yardstick of every hand-written backward in the tests."""


def central_difference(f, array, index, eps):
    """(f(x + eps e_i) - f(x - eps e_i)) / (2 eps), perturbing `array` in place and restoring it."""
    old = array[index]
    array[index] = old + eps
    up = f()
    array[index] = old - eps
    down = f()
    array[index] = old
    return (up - down) / (2 * eps)
