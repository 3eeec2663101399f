"""Small dense matrices as lists of rows."""


def shape(matrix):
    """``(rows, columns)``."""
    return len(matrix), len(matrix[0]) if matrix else 0


def identity(n):
    """The n x n identity."""
    return [[1 if row == column else 0 for column in range(n)] for row in range(n)]


def transpose(matrix):
    """Rows become columns."""
    rows, columns = shape(matrix)
    return [[matrix[row][column] for row in range(rows)] for column in range(columns)]


def matmul(left, right):
    """Matrix product; raises ``ValueError`` on mismatched shapes."""
    rows, inner = shape(left)
    inner_right, columns = shape(right)
    if inner != inner_right:
        raise ValueError("shapes do not match")
    return [[sum(left[i][k] * right[k][j] for k in range(inner)) for j in range(columns)]
            for i in range(rows)]


def determinant(matrix):
    """Determinant by Laplace expansion along the first row."""
    rows, columns = shape(matrix)
    if rows != columns:
        raise ValueError("determinant needs a square matrix")
    if rows == 1:
        return matrix[0][0]
    if rows == 2:
        return matrix[0][0] * matrix[1][1] - matrix[0][1] * matrix[1][0]
    total = 0
    for column in range(columns):
        minor = [row[:column] + row[column + 1:] for row in matrix[1:]]
        sign = -1 if column % 2 else 1
        total += sign * matrix[0][column] * determinant(minor)
    return total


def trace(matrix):
    """Sum of the diagonal."""
    return sum(matrix[i][i] for i in range(min(shape(matrix))))
