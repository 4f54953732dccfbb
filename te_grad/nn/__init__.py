"""te_grad.nn: common operators written purely in the te_grad DSL."""
