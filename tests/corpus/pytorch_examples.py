"""Model classes of two PyTorch public examples, as the corpus's non-``transformers`` models.

Upstream (github.com/pytorch/examples, BSD-3-Clause licence, Copyright (c) 2017 PyTorch
contributors):

- ``word_language_model/model.py``: ``RNNModel``, the LSTM word language model;
- ``dcgan/main.py``: ``Generator``, ``Discriminator`` and ``weights_init``.

The workbench's rules keep public source text out of this repository, so these are written here, not
pasted: the same modules in the same order with the same initialisation, and the same forward code
paths, including the idioms a port meets (``Tensor.is_cuda`` gating ``data_parallel``,
``new_zeros`` for the hidden state, ``view``/``squeeze`` reshapes, in-place activations). Only the
upstream script's command-line globals (``nz``, ``ngf``, ``ndf``, ``nc``) are module constants here,
chosen small so the corpus stays fast; the image size stays upstream's 64x64.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# --- word_language_model/model.py ----------------------------------------------------------------


class RNNModel(nn.Module):
    """Embedding, recurrent stack (LSTM, GRU, RNN_TANH, RNN_RELU) and a linear decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ("LSTM", "GRU"):
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        else:
            nonlinearities = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}
            if rnn_type not in nonlinearities:
                raise ValueError("rnn_type must be one of 'LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU'")
            self.rnn = nn.RNN(
                ninp, nhid, nlayers, nonlinearity=nonlinearities[rnn_type], dropout=dropout
            )
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            # Press & Wolf 2016; Inan et al. 2016: share the input and output embeddings.
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (
                weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid),
            )
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


# --- dcgan/main.py ---------------------------------------------------------------------------------

nz = 16  # size of the latent vector (upstream default 100)
ngf = 8  # generator feature maps (upstream default 64)
ndf = 8  # discriminator feature maps (upstream default 64)
nc = 3  # image channels


def weights_init(m):
    """DCGAN's initialisation: conv weights N(0, 0.02), batch-norm weights N(1, 0.02), bias 0."""
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    """Latent vector (nz x 1 x 1) to a 64x64 image through five transposed convolutions."""

    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False),  # -> (ngf*8) x 4 x 4
            nn.BatchNorm2d(ngf * 8),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False),  # -> (ngf*4) x 8 x 8
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),  # -> (ngf*2) x 16 x 16
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),  # -> ngf x 32 x 32
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),  # -> nc x 64 x 64
            nn.Tanh(),
        )

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output


class Discriminator(nn.Module):
    """A 64x64 image to the probability that it is real, through five strided convolutions."""

    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),  # -> ndf x 32 x 32
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),  # -> (ndf*2) x 16 x 16
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),  # -> (ndf*4) x 8 x 8
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False),  # -> (ndf*8) x 4 x 4
            nn.BatchNorm2d(ndf * 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),  # -> 1 x 1 x 1
            nn.Sigmoid(),
        )

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output.view(-1, 1).squeeze(1)
