"""The LLVM corpus tool's normalization ignores the vector-width attribute and nothing else."""
from te_grad.tools.corpus import normalized

A = """define void @f() #0 {
  ret void
}
define void @g() #1 {
  ret void
}
attributes #0 = { nounwind "min-legal-vector-width"="512" }
attributes #1 = { nounwind readnone }
"""
B = """define void @f() #0 {
  ret void
}
define void @g() #1 {
  ret void
}
attributes #0 = { nounwind }
attributes #1 = { nounwind readnone }
"""


def test_normalization_ignores_the_vector_width_attribute_only():
    assert A != B and normalized(A) == normalized(B)
    assert normalized(A.replace("readnone", "readonly")) != normalized(B)  # any other attribute counts
    assert normalized(A.replace("@g", "@h")) != normalized(B)             # and so does the code

