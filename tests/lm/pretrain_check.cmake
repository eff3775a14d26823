# kiln-lm pretrain end to end on a tiny corpus (tests/gpt/corpus) with the real
# Llama-2 tokenizer: trains N iterations in one run, and N/2 + a --resume run to
# N in another, and requires the same final validation loss (exact resume).
# pretrain itself reloads the Hugging Face directory (load_pretrained) and the
# GGUF file (load_gguf) it wrote and fails unless their logits equal the trained
# model's; this script checks it said so and that the directory is complete.
#   cmake -DLM=kiln-lm -DCORPUS=dir -DTOKENIZER=dir -DWORK=dir -P pretrain_check.cmake
set(common pretrain --data ${CORPUS} --tokenizer ${TOKENIZER} --layers 1 --heads 2
         --kv-heads 1 --intermediate 32 --block 16 --batch 4 --warmup 4 --eval-windows 16 --threads 1
         --cache ${WORK}/corpus.tok)
set(args ${common} --hidden 16)
file(REMOVE_RECURSE ${WORK})
function(run out err)
  execute_process(COMMAND ${LM} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kiln-lm ${ARGN} failed (${rc}):\n${o}\n${e}")
  endif()
  set(${out} "${o}" PARENT_SCOPE)
  set(${err} "${e}" PARENT_SCOPE)
endfunction()
function(val_loss out text)
  if(NOT text MATCHES "val_loss=([0-9.]+)")
    message(FATAL_ERROR "no val_loss= in: ${text}")
  endif()
  set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()
run(a ea ${args} --iters 20 --eval-interval 10 --out ${WORK}/a --gguf ${WORK}/a.gguf)
run(b1 eb1 ${args} --iters 20 --eval-interval 10 --out ${WORK}/b --stop-after 10)
run(b2 eb2 ${args} --iters 20 --eval-interval 10 --out ${WORK}/b --resume)
val_loss(la "${a}")
val_loss(lb "${b2}")
if(NOT a MATCHES "val_loss=[0-9.]+ train_tokens_per_s=[0-9]+ train_time_s=[0-9.]+ peak_rss_mb=[0-9.]+")
  message(FATAL_ERROR "summary line incomplete: ${a}")
endif()
if(NOT la STREQUAL lb)
  message(FATAL_ERROR "resumed run ends at val_loss ${lb}, uninterrupted at ${la}")
endif()
if(NOT la LESS 10.0)
  message(FATAL_ERROR "val_loss ${la} after 20 iterations: not learning (ln 32000 = 10.37)")
endif()
foreach(f config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json)
  if(NOT EXISTS ${WORK}/a/${f})
    message(FATAL_ERROR "the saved directory has no ${f}")
  endif()
endforeach()
file(READ ${WORK}/a/generation_config.json gen)
if(NOT gen MATCHES "\"bos_token_id\": 1" OR NOT gen MATCHES "\"eos_token_id\": \\[2\\]")
  message(FATAL_ERROR "generation_config.json lacks Llama-2's bos 1 / eos 2: ${gen}")
endif()
if(NOT ea MATCHES "reloaded logits differ by [0-9.e+-]+\n.*GGUF with the vocabulary\\): reloaded logits differ by")
  message(FATAL_ERROR "pretrain did not check its saved files:\n${ea}")
endif()
execute_process(COMMAND ${LM} ${common} --hidden 24 --iters 20 --out ${WORK}/c --checkpoint ${WORK}/b.ckpt.gguf --resume
                RESULT_VARIABLE rc ERROR_VARIABLE e OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT e MATCHES "another model config")
  message(FATAL_ERROR "resuming with another config must fail naming it (${rc}): ${e}")
endif()
# --precision bf16 (matmuls on bf16 operands, f32 master weights): it learns as
# f32 does, and its saved f32 files reload to its logits (pretrain checks them in
# a context with the same policy and fails otherwise).
run(d ed ${args} --iters 20 --eval-interval 10 --out ${WORK}/d --precision bf16)
val_loss(ld "${d}")
if(NOT ld LESS 10.0 OR NOT ed MATCHES "reloaded logits differ by")
  message(FATAL_ERROR "--precision bf16: val_loss ${ld} after 20 iterations or no reload check:\n${ed}")
endif()
message(STATUS "kiln-lm pretrain: val_loss ${la} (uninterrupted) = ${lb} (resumed); bf16 ${ld}")
