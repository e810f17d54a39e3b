"""Small example models (an MLP, a CNN, a transformer block) for `nnc dump` and the README."""
import runtime as torch
from runtime import nn

torch.manual_seed(0)


class MLP(nn.Module):
    """784-512-512-10 multilayer perceptron with ReLU, for flattened 28x28 images."""

    def __init__(self, sizes=(784, 512, 512, 10)):
        super().__init__()
        self.fc1 = nn.Linear(sizes[0], sizes[1])
        self.fc2 = nn.Linear(sizes[1], sizes[2])
        self.fc3 = nn.Linear(sizes[2], sizes[3])

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    """Conv2d + ReLU + MaxPool2d, twice, then Flatten + Linear: 1x28x28 images to 10 classes."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(16 * 7 * 7, num_classes)

    def forward(self, x):
        x = self.pool(self.relu(self.conv1(x)))     # 8 x 14 x 14
        x = self.pool(self.relu(self.conv2(x)))     # 16 x 7 x 7
        return self.fc(self.flatten(x))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: self-attention and an MLP, each with a residual connection (batch_first)."""

    def __init__(self, embed_dim=32, num_heads=4, mlp_ratio=4):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim)
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(
            nn.Linear(embed_dim, mlp_ratio * embed_dim),
            nn.GELU(),
            nn.Linear(mlp_ratio * embed_dim, embed_dim),
        )

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]     # [0]: the output; [1] would be the weights
        return x + self.mlp(self.norm2(x))


mlp = MLP().eval()
cnn = CNN().eval()
block = TransformerBlock().eval()
