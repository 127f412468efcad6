# distir export --to megatron: llama3-8b d2.t4.sp.p2.k4.1f1b.z1, batch 64, bf16 fp8
# world size 16 = d·t·p = 2·4·2; ranks in Megatron-LM's order (TP fastest, then CP, then DP, then PP)
MEGATRON_ARGS=(
  --tensor-model-parallel-size 4
  --pipeline-model-parallel-size 2
  --micro-batch-size 8
  --global-batch-size 64
  --sequence-parallel
  --overlap-grad-reduce
  --use-distributed-optimizer
  --bf16
  --fp8-format hybrid
  --fp8-recipe tensorwise
  --num-layers 32
  --hidden-size 4096
  --ffn-hidden-size 14336
  --num-attention-heads 32
  --seq-length 8192
  --max-position-embeddings 8192
  --vocab-size 128256
  --hidden-dropout 0
  --attention-dropout 0
  --untie-embeddings-and-output-weights
  --swiglu
  --normalization RMSNorm
  --position-embedding-type rope
  --rotary-base 500000
  --disable-bias-linear
  --group-query-attention
  --num-query-groups 8
)
# on 16 GPUs: torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" plus your data, tokenizer and learning-rate arguments
