import pytest

from numkit.matrix import determinant, identity, matmul, shape, trace, transpose


def test_shape():
    assert shape([[1, 2, 3], [4, 5, 6]]) == (2, 3)


def test_identity():
    assert identity(2) == [[1, 0], [0, 1]]


def test_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_matmul():
    assert matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]


def test_matmul_rectangular():
    assert matmul([[1, 2, 3]], [[1], [2], [3]]) == [[14]]


def test_matmul_mismatch():
    with pytest.raises(ValueError):
        matmul([[1, 2]], [[1, 2]])


def test_determinant():
    assert determinant([[2]]) == 2
    assert determinant([[1, 2], [3, 4]]) == -2
    assert determinant([[6, 1, 1], [4, -2, 5], [2, 8, 7]]) == -306


def test_determinant_non_square():
    with pytest.raises(ValueError):
        determinant([[1, 2]])


def test_trace():
    assert trace([[1, 2], [3, 4]]) == 5
