"""The model of Keras' guide "Customizing what happens in fit() with JAX", with kgrad.value_and_grad.

Shared by tests/jax/test_own_step_jax.py and tests/scripts/data_parallel_jax.py (which puts
this folder on its path). Its ``train_step`` is the guide's, with ``kgrad.value_and_grad``
for ``jax.value_and_grad``; with ``scales_loss``, it differentiates the loss scaled by its
optimizer, as Keras' own JAX step does under mixed precision.
"""

import keras

import kgrad


class GuideModel(keras.Model):
    """The guide's first example, with ``kgrad.value_and_grad`` for ``jax.value_and_grad``."""

    part_name = None  # kgrad.value_and_grad's name=
    differentiate = staticmethod(lambda trainable_variables: trainable_variables)
    scales_loss = False  # differentiate self.optimizer.scale_loss(loss) (mixed precision)

    def compute_loss_and_updates(
        self, trainable_variables, non_trainable_variables, metrics_variables, x, y, sample_weight,
        training=False, optimizer_variables=None,
    ):
        y_pred, non_trainable_variables = self.stateless_call(
            trainable_variables, non_trainable_variables, x, training=training
        )
        loss, (trainable_variables, non_trainable_variables, metrics_variables) = self.stateless_compute_loss(
            trainable_variables, non_trainable_variables, metrics_variables, x=x, y=y, y_pred=y_pred,
            sample_weight=sample_weight, training=training,
        )
        aux = (loss, y_pred, non_trainable_variables, metrics_variables)
        if self.scales_loss:
            # The step's scale: the optimizer's variables as the state holds them, as Keras' step reads it.
            mapping = list(zip(self.optimizer.variables, optimizer_variables))
            with keras.StatelessScope(state_mapping=mapping):
                return self.optimizer.scale_loss(loss), aux
        return loss, aux

    def train_step(self, state, data):
        trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        grad_fn = kgrad.value_and_grad(self.compute_loss_and_updates, has_aux=True, name=self.part_name)
        (_, (loss, y_pred, non_trainable_variables, metrics_variables)), grads = grad_fn(
            self.differentiate(trainable_variables), non_trainable_variables, metrics_variables,
            x, y, sample_weight, training=True, optimizer_variables=optimizer_variables,
        )
        trainable_variables, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable_variables
        )
        new_metrics_vars, logs = [], {}
        for metric in self.metrics:
            this = metrics_variables[len(new_metrics_vars) : len(new_metrics_vars) + len(metric.variables)]
            if metric.name == "loss":
                this = metric.stateless_update_state(this, loss, sample_weight=sample_weight)
            else:
                this = metric.stateless_update_state(this, y, y_pred, sample_weight=sample_weight)
            logs[metric.name] = metric.stateless_result(this)
            new_metrics_vars += this
        return logs, (trainable_variables, non_trainable_variables, optimizer_variables, new_metrics_vars)
